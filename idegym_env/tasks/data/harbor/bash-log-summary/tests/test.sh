#!/bin/bash
# Runs /app/summarize.sh on three logs; reward 1 when every output is exactly right.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
work=$(mktemp -d)
cat > "$work/a.log" <<'LOG'
10.0.0.1 - - [01/Dec/2026:10:00:00 +0000] "GET / HTTP/1.1" 200 512
10.0.0.2 - - [01/Dec/2026:10:00:01 +0000] "GET /missing HTTP/1.1" 404 128
10.0.0.1 - - [01/Dec/2026:10:00:02 +0000] "POST /login HTTP/1.1" 302 -
10.0.0.3 - - [01/Dec/2026:10:00:03 +0000] "GET /app.js HTTP/1.1" 200 2048
garbage line
10.0.0.2 - - [01/Dec/2026:10:00:04 +0000] "GET / HTTP/1.1" 200 512
LOG
printf '200 3\n302 1\n404 1\nbytes 3200\ntop 10.0.0.1\n' > "$work/a.want"
cat > "$work/b.log" <<'LOG'
b.example - - [02/Dec/2026:00:00:00 +0000] "GET /x HTTP/1.0" 500 10
a.example - - [02/Dec/2026:00:00:01 +0000] "GET /y HTTP/1.0" 404 20
b.example - - [02/Dec/2026:00:00:02 +0000] "GET /z HTTP/1.0" 404 30
a.example - - [02/Dec/2026:00:00:03 +0000] "GET /w HTTP/1.0" 500 -
c.example - - [02/Dec/2026:00:00:04 +0000] "GET /v HTTP/1.0" 20 5
c.example - - [02/Dec/2026:00:00:05 +0000] "GET /u HTTP/1.0" 301 40
LOG
printf '404 2\n500 2\n301 1\nbytes 100\ntop a.example\n' > "$work/b.want"
printf 'only three fields\n' > "$work/c.log"
printf 'bytes 0\n' > "$work/c.want"
pass=0; total=0
for name in a b c; do
    total=$((total + 1))
    if timeout 20 bash /app/summarize.sh "$work/$name.log" > "$work/$name.got" 2> "$work/$name.err" \
        && diff -u "$work/$name.want" "$work/$name.got"; then
        pass=$((pass + 1)); echo "PASS $name"
    else
        echo "FAIL $name"; cat "$work/$name.err"
    fi
done
echo "$pass passed, $((total - pass)) failed"
if [ "$pass" -eq "$total" ]; then echo 1 > /logs/verifier/reward.txt; fi
