# Joins every publish record to its connection's open record on (run, conn), the key that names one
# connection across taps and restarts, and adds the tap id and the client's product to it.
# Usage: jq -s -f join-open.jq merged.jsonl   (merged.jsonl: the record files of several taps, concatenated)
(map(select(.type == "connection" and .event == "open")) | INDEX("\(.run)/\(.conn)")) as $open
| .[] | select(.type == "publish")
| . + {tap: $open["\(.run)/\(.conn)"].tap, product: $open["\(.run)/\(.conn)"].product}
