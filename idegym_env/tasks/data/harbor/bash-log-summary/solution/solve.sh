#!/bin/bash
set -e
cat > /app/summarize.sh <<'SH'
#!/bin/bash
# Summarise a Common Log Format access log: status counts, total bytes, busiest host.
set -euo pipefail
log=${1:?usage: summarize.sh ACCESS_LOG}
valid=$(awk 'NF >= 10 && $(NF-1) ~ /^[0-9][0-9][0-9]$/' "$log")
if [ -n "$valid" ]; then
    printf '%s\n' "$valid" | awk '{print $(NF-1)}' | sort | uniq -c | sort -k1,1nr -k2,2n \
        | awk '{print $2, $1}'
fi
printf '%s\n' "$valid" | awk '$NF != "-" {s += $NF} END {print "bytes", s + 0}'
if [ -n "$valid" ]; then
    printf '%s\n' "$valid" | awk '{print $1}' | sort | uniq -c | sort -k1,1nr -k2,2 | head -n 1 \
        | awk '{print "top", $2}'
fi
SH
chmod +x /app/summarize.sh
