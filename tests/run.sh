#!/bin/sh
# run.sh BUILD PROGRAM... - run test programs, print one line each and a summary, fail if any failed.
# A program's output goes to BUILD/test-logs/NAME.log; a failing program's log is printed whole.
# CMocka prints "[  SKIPPED ]" for skipped tests: those are counted and shown, never as passes.
set -u
build=$1; shift
logs=$build/test-logs
# Sanitizer builds: suppress only third-party leaks (tests/lsan.supp says which), fail on UBSan.
here=$(cd "$(dirname "$0")" && pwd)
export LSAN_OPTIONS="suppressions=$here/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
mkdir -p "$logs"
pass=0; fail=0; skip=0; failed=""
for t in "$@"; do
	name=$(echo "$t" | sed "s|^$build/tests/||; s|/|-|g")
	log=$logs/$name.log
	start=$(date +%s)
	FA_BUILD=$build "$t" >"$log" 2>&1
	rc=$?
	secs=$(( $(date +%s) - start ))
	s=$(grep -c '^\[  SKIPPED \]' "$log" 2>/dev/null); s=${s:-0}
	if [ $rc -eq 0 ]; then
		pass=$((pass + 1)); skip=$((skip + s))
		if [ "$s" -gt 0 ]; then
			printf '  PASS   %-40s %4ss  (%s skipped:' "$name" "$secs" "$s"
			grep -h -i -m 3 'skip' "$log" | grep -v '^\[  SKIPPED \]' | head -n 1 | cut -c1-80 | tr -d '\n'
			printf ')\n'
		else
			printf '  PASS   %-40s %4ss\n' "$name" "$secs"
		fi
	else
		fail=$((fail + 1)); failed="$failed $name"
		printf '  FAIL   %-40s %4ss  (exit %s)\n' "$name" "$secs" "$rc"
		sed 's/^/      | /' "$log" | tail -n 80
	fi
done
echo "tests: $pass passed, $fail failed, $skip skipped test cases (logs in $logs)"
[ $fail -eq 0 ] || { echo "failed:$failed"; exit 1; }
