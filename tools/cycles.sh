#!/bin/sh
# cycles.sh [BUILD] - fail when source files call each other in a loop.
#
# File A depends on file B when A's object uses a global symbol that B's object defines: `nm`
# of every BUILD/*/**/*.o but BUILD/tests/ (common/, proto/, kernels/, client/, daemon/ and any
# folder added later), so it checks what was compiled, not what was included. Every group of two
# or more files that depend on each other in a loop (a strongly connected component) is printed
# with the symbols that tie it, and the exit status is 1 (2: no objects, or nm failed). A loop
# means no file of it can be read, tested or replaced without the others; the layering each
# folder keeps instead is written in its README (daemon/README.md, "Who calls whom"). Run by
# `make test-quick` after the build; needs only nm and a POSIX awk.
set -u
build=${1:-build}
build=${build%/}
NM=${NM:-nm}

# Cycles known and being removed, one per entry, files sorted, entries separated by ';'. A
# listed cycle is still printed but does not fail; one that grows or shrinks is a new cycle.
allow=""

objs=$(for d in "$build"/*/; do
	case $d in "$build/tests/") continue ;; esac
	[ -d "$d" ] || continue
	# Only objects whose source still exists: a stale object of a moved or deleted file would
	# define the same symbols as its successor and could hide an edge (it hid one once).
	find "$d" -name '*.o' | while read -r o; do
		src=${o#"$build"/}
		[ -f "${src%.o}.c" ] && echo "$o"
	done
done | sort)
if [ -z "$objs" ]; then
	echo "cycles: no object files under $build/ (build first)" >&2
	exit 2
fi

# One "FILE: SYMBOL TYPE ..." line per symbol, sorted by symbol so each edge lists its symbols
# in order; FILE becomes the source's name without .o.
# shellcheck disable=SC2086 # the object list is word-split on purpose (paths have no spaces)
{ $NM -A -P $objs || echo "! nm failed"; } | LC_ALL=C sort -k2,2 -k1,1 |
awk -v build="$build/" -v allow="$allow" '
function node(f) {
	sub(/:$/, "", f)
	if (index(f, build) == 1)
		f = substr(f, length(build) + 1)
	sub(/\.o$/, "", f)
	if (!(f in id)) {
		id[f] = ++n
		name[n] = f
	}
	return id[f]
}
$1 == "!" {
	print "cycles: " $2 " " $3 > "/dev/stderr"
	failed = 1
	exit 2
}
{
	v = node($1); sym = $2; kind = $3
	if (kind == "U") {
		use_file[++nuses] = v
		use_sym[nuses] = sym
	} else if (kind ~ /^[TDBRVW]$/ && !(sym in def))
		def[sym] = v
}
END {
	if (failed)
		exit 2
	for (u = 1; u <= nuses; u++) {
		a = use_file[u]; sym = use_sym[u]
		if (!(sym in def) || def[sym] == a)
			continue
		b = def[sym]
		reach[a, b] = 1
		if ((a, b) in why)
			why[a, b] = why[a, b] ", " sym
		else
			why[a, b] = sym
	}
	# Transitive closure (Warshall): a few dozen files, so n^3 is nothing.
	for (k = 1; k <= n; k++)
		for (i = 1; i <= n; i++)
			if ((i, k) in reach)
				for (j = 1; j <= n; j++)
					if ((k, j) in reach)
						reach[i, j] = 1
	# Each file in a loop with others belongs to the loop of the files reachable both ways.
	ncyc = 0; bad = 0
	for (i = 1; i <= n; i++) {
		if (i in done || !((i, i) in reach))
			continue
		m = 0
		for (j = 1; j <= n; j++)
			if (j == i || ((i, j) in reach && (j, i) in reach)) {
				done[j] = 1
				member[++m] = name[j]
			}
		# Sorted members: the allow list names them so.
		for (x = 2; x <= m; x++)
			for (y = x; y > 1 && member[y - 1] > member[y]; y--) {
				t = member[y]; member[y] = member[y - 1]; member[y - 1] = t
			}
		list = member[1]
		for (x = 2; x <= m; x++)
			list = list " " member[x]
		known = index(";" allow ";", ";" list ";") > 0
		ncyc++
		if (!known)
			bad++
		print (known ? "cycle (allowed, being removed): " : "cycle: ") list
		for (x = 1; x <= m; x++)
			for (y = 1; y <= m; y++)
				if ((id[member[x]], id[member[y]]) in why)
					print "  " member[x] " -> " member[y] ": " \
					    why[id[member[x]], id[member[y]]]
	}
	printf "cycles: %d call cycle(s) among %d files, %d not allowed\n", ncyc, n, bad
	exit bad > 0 ? 1 : 0
}'
