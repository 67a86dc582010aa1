#!/bin/bash
# Builds /app/adler32.c afresh (a prebuilt binary does not count) and checks five inputs.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
work=$(mktemp -d)
if ! gcc -O2 -std=c99 -o "$work/adler32" /app/adler32.c; then
    echo "does not compile"; exit 0
fi
check() {  # name expected input-file
    got=$("$work/adler32" < "$3")
    if [ "$got" = "$2" ]; then echo "PASS $1"; pass=$((pass + 1)); else echo "FAIL $1: expected $2, got $got"; fi
    total=$((total + 1))
}
pass=0; total=0
printf 'hello world\n' > "$work/hello"
head -c 300 /dev/zero | tr '\0' '\377' > "$work/high"
yes abcdefghij | head -c 100000 > "$work/big"
head -c 70000 /dev/zero > "$work/zeros"
check empty 00000001 /dev/null
check hello 1e720467 "$work/hello"
check high b90f2ae4 "$work/high"
check big bf4537cc "$work/big"
check zeros 117f0001 "$work/zeros"
echo "$pass passed, $((total - pass)) failed"
if [ "$pass" -eq "$total" ]; then echo 1 > /logs/verifier/reward.txt; fi
