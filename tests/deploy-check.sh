#!/bin/sh
# deploy-check.sh BUILD - check deploy/: the Kubernetes manifests parse and carry what CUDA IPC
# between pods needs (python3's yaml where installed, else a line checker); the Slurm scripts
# pass shellcheck (else sh -n), a per-job daemon really starts from fa-prolog.sh without systemd
# (the build's fa-daemon, the CPU backend), answers fa-ctl ping on a 0600 socket that
# fa-task-prolog.sh exports as FA_SOCKET, and fa-epilog.sh stops it and removes its directory;
# with systemd, the prolog's systemd-run and the epilog's systemctl (stubs) get the job's uid,
# its GPUs and the socket.
set -eu
build=$1
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/fa-deploy.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "deploy-check: $*" >&2; exit 1; }

# ---- Kubernetes ----------------------------------------------------------------------------
ds=$here/deploy/kubernetes/fa-daemon.yaml
cl=$here/deploy/kubernetes/client-example.yaml
if python3 -c 'import yaml' 2>/dev/null; then
	python3 - "$ds" "$cl" <<'PY' || fail "kubernetes manifests: see above"
import sys, yaml
docs = list(yaml.safe_load_all(open(sys.argv[1])))
client = list(yaml.safe_load_all(open(sys.argv[2])))
def need(cond, what):
    if not cond:
        print("deploy-check: fa-daemon.yaml: " + what, file=sys.stderr); sys.exit(1)
ds = [d for d in docs if d and d.get("kind") == "DaemonSet"]
need(len(ds) == 1, "one DaemonSet")
ds = ds[0]
need(ds["apiVersion"] == "apps/v1", "apiVersion apps/v1")
sel = ds["spec"]["selector"]["matchLabels"]
tpl = ds["spec"]["template"]
need(all(tpl["metadata"]["labels"].get(k) == v for k, v in sel.items()), "selector matches the template's labels")
pod = tpl["spec"]
need(pod.get("hostIPC") is True, "hostIPC: true (host buffers and CUDA IPC events live in /dev/shm)")
need(pod.get("hostPID") is True, "hostPID: true (legacy CUDA IPC handles do not cross PID namespaces)")
need(pod.get("terminationGracePeriodSeconds", 30) >= 60, "a grace period for the drain (>= 60 s)")
vols = {v["name"]: v for v in pod["volumes"]}
c = pod["containers"][0]
args = " ".join(c.get("command", []) + c.get("args", []))
need("--socket=/run/fa-daemon/fa.sock" in args, "the daemon listens on /run/fa-daemon/fa.sock")
mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
need(mounts.get("/run/fa-daemon") in vols and vols[mounts["/run/fa-daemon"]]["hostPath"]["path"] == "/run/fa-daemon",
     "the socket directory is the hostPath /run/fa-daemon")
env = {e["name"]: e.get("value") for e in c.get("env", [])}
need(env.get("NVIDIA_VISIBLE_DEVICES") == "all", "every GPU of the node through NVIDIA_VISIBLE_DEVICES=all")
need("nvidia.com/gpu" not in c.get("resources", {}).get("limits", {}), "no nvidia.com/gpu request (it would take the GPUs from the clients)")
for probe in ("livenessProbe", "startupProbe"):
    cmd = c[probe]["exec"]["command"]
    need(cmd[0].endswith("fa-ctl") and cmd[-1] == "ping" and "/run/fa-daemon/fa.sock" in cmd, probe + " is fa-ctl ping on the socket")
need(c["livenessProbe"]["timeoutSeconds"] > 5, "the liveness timeout exceeds fa-ctl's --timeout")
sc = c.get("securityContext", {})
need(sc.get("allowPrivilegeEscalation") is False and "ALL" in sc.get("capabilities", {}).get("drop", []), "no privilege escalation, capabilities dropped")
p = [d for d in client if d and d.get("kind") == "Pod"][0]["spec"]
need(p.get("hostIPC") is True and p.get("hostPID") is True, "client-example.yaml: hostIPC and hostPID")
cenv = {e["name"]: e.get("value") for e in p["containers"][0]["env"]}
need(cenv.get("FA_SOCKET") == "/run/fa-daemon/fa.sock", "client-example.yaml: FA_SOCKET")
need(any(v.get("hostPath", {}).get("path") == "/run/fa-daemon" for v in p["volumes"]), "client-example.yaml: the socket's hostPath")
print("deploy-check: kubernetes manifests ok (python3 yaml)")
PY
else
	# No yaml module: the lines that matter, and no tab (YAML forbids tabs for indentation).
	for want in 'kind: DaemonSet' 'hostIPC: true' 'hostPID: true' 'path: /run/fa-daemon' \
		'--socket=/run/fa-daemon/fa.sock' 'value: all' 'livenessProbe:' '"ping"]'; do
		grep -qF -- "$want" "$ds" || fail "fa-daemon.yaml lacks '$want'"
	done
	for want in 'hostIPC: true' 'hostPID: true' 'value: /run/fa-daemon/fa.sock'; do
		grep -qF -- "$want" "$cl" || fail "client-example.yaml lacks '$want'"
	done
	! grep -q "$(printf '\t')" "$ds" "$cl" || fail "a tab in a manifest"
	echo "deploy-check: kubernetes manifests ok (line checks; python3 yaml is not installed)"
fi

# ---- Slurm -----------------------------------------------------------------------------------
slurm=$here/deploy/slurm
for f in "$slurm"/*.sh; do
	sh -n "$f" || fail "$f does not parse"
done
if command -v shellcheck >/dev/null 2>&1; then
	shellcheck -s sh "$slurm"/*.sh || fail "shellcheck"
fi

# A real per-job daemon, without systemd.
export SLURM_JOB_ID=4242 SLURM_JOB_UID SLURM_JOB_GID SLURM_JOB_USER
SLURM_JOB_UID=$(id -u)
SLURM_JOB_GID=$(id -g)
SLURM_JOB_USER=$(id -un)
export FA_BINDIR="$build" FA_RUNDIR="$work/run" FA_SLURM_SYSTEMD=0 FA_START_TIMEOUT_S=30
unset SLURM_JOB_GPUS
sh "$slurm/fa-prolog.sh" 2>"$work/prolog.err" || { cat "$work/prolog.err" >&2; fail "fa-prolog.sh failed"; }
sock="$work/run/job-4242/fa.sock"
[ -S "$sock" ] || fail "no socket at $sock"
[ "$(stat -c %a "$sock")" = 600 ] || fail "the job's socket is not 0600"
[ "$(stat -c %u "$work/run/job-4242")" = "$SLURM_JOB_UID" ] || fail "the job's directory is not the user's"
line=$(sh "$slurm/fa-task-prolog.sh")
[ "$line" = "export FA_SOCKET=$sock" ] || fail "fa-task-prolog.sh printed '$line'"
FA_SOCKET=$sock "$build/fa-ctl" ping >/dev/null || fail "fa-ctl ping through the task's FA_SOCKET"
pid=$(cat "$work/run/job-4242/daemon.pid")
sh "$slurm/fa-epilog.sh" || fail "fa-epilog.sh failed"
! kill -0 "$pid" 2>/dev/null || fail "the daemon (pid $pid) outlived the epilog"
[ ! -e "$work/run/job-4242" ] || fail "the job's directory outlived the epilog"
[ -z "$(sh "$slurm/fa-task-prolog.sh")" ] || fail "fa-task-prolog.sh exported a socket that is gone"

# With systemd: what systemd-run and systemctl are asked (stubs on PATH).
mkdir -p "$work/bin"
printf '#!/bin/sh\necho "$@" >> "%s/calls"\n' "$work" > "$work/bin/systemd-run"
printf '#!/bin/sh\necho systemctl "$@" >> "%s/calls"\n' "$work" > "$work/bin/systemctl"
chmod +x "$work/bin/systemd-run" "$work/bin/systemctl"
SLURM_JOB_GPUS=0,2 FA_SLURM_SYSTEMD=1 PATH="$work/bin:$PATH" sh "$slurm/fa-prolog.sh" 2>/dev/null ||
	fail "fa-prolog.sh (systemd) failed"
for want in "--unit=fa-daemon-job-4242" "--uid=$SLURM_JOB_UID" "-p Type=notify" \
	"--setenv=CUDA_VISIBLE_DEVICES=0,2" "--setenv=CUDA_DEVICE_ORDER=PCI_BUS_ID" \
	"--socket $sock --socket-mode 0600 --backend auto" "LimitNOFILE=1024:8192"; do
	grep -qF -- "$want" "$work/calls" || fail "systemd-run was not given '$want': $(cat "$work/calls")"
done
FA_SLURM_SYSTEMD=1 PATH="$work/bin:$PATH" sh "$slurm/fa-epilog.sh"
grep -qx "systemctl stop fa-daemon-job-4242.service" "$work/calls" || fail "the epilog did not stop the unit"
echo "deploy-check: slurm prolog, task prolog and epilog ok (a real per-job daemon; systemd-run's arguments)"
