#!/bin/sh
# Every process of a multi-part job says who it is and lists everybody, with proxy-runtime.
# PROXY_RUNTIME is how to run the command (default: proxy-runtime on the PATH).
set -e
rt() { ${PROXY_RUNTIME:-proxy-runtime} --timeout 600 "$@"; }

passed=$(rt barrier)            # prints: PART-INDEX PARTS
set -- $passed
part=$1 parts=$2
rank=$(rt rank)
printf '%s' "$(hostname) pid $$ is rank $rank of part $part (of $parts)" | rt register --rank "$rank" >/dev/null
if [ "$rank" = 0 ]; then
    rt forward                  # the agent passes this part's data on to the whole job
fi
everyone=$(rt rendezvous --level 2 --items)
echo "part $part rank $rank sees:"
printf '%s\n' "$everyone" | sed 's/^/    /'
