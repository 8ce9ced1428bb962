#!/bin/sh
# run.sh BUILD - the Python package's tests against BUILD's libfaclient and fa-daemon.
# Picks an interpreter that has NumPy ($PYTHON, else python3 on PATH, else /usr/bin/python3),
# installing Debian's python3-numpy and python3-venv first when root (tools/deps.sh python).
# Without python3 the tests are skipped with the reason; without NumPy the tests that need it
# skip (under CI=true that is a failure). The log goes to BUILD/test-logs/python.log.
set -u
build=$1
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
logs=$build/test-logs
mkdir -p "$logs"
log=$logs/python.log

sh "$root/tools/deps.sh" python || true
pick=""
for p in ${PYTHON:-} python3 /usr/bin/python3; do
	command -v "$p" >/dev/null 2>&1 || continue
	[ -z "$pick" ] && pick=$p
	if "$p" -c 'import numpy' >/dev/null 2>&1; then pick=$p; break; fi
done
if [ -z "$pick" ]; then
	echo "  SKIP   python                                   (python3 is not installed)"
	exit 0
fi
if ! "$pick" -c 'import numpy' >/dev/null 2>&1 && [ "${CI:-}" = true ]; then
	echo "python: NumPy is missing for $pick (make deps installs python3-numpy)" >&2
	exit 1
fi
start=$(date +%s)
case $build in /*) abs=$build ;; *) abs=$root/$build ;; esac
FA_BUILD=$abs "$pick" "$here/run_tests.py" >"$log" 2>&1
rc=$?
secs=$(( $(date +%s) - start ))
summary=$(grep '^python: .* passed' "$log" | tail -n 1)
if [ $rc -eq 0 ]; then
	printf '  PASS   %-40s %4ss  (%s, %s)\n' python "$secs" "${summary#python: }" "$pick"
	grep '^  SKIP' "$log" | cut -c1-120
else
	printf '  FAIL   %-40s %4ss  (exit %s)\n' python "$secs" "$rc"
	sed 's/^/      | /' "$log" | tail -n 80
fi
echo "$summary"
exit $rc
