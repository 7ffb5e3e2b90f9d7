#!/bin/sh
# Slurm Prolog (run by slurmd as root before a job starts on a node): a job that asked for
# Wormhole device memory (--gres=whmem:SIZE, SIZE in bytes with K/M/G/T suffixes of 1024)
# becomes a Wormhole tenant with exactly that quota. Its token goes to a file only the job's
# user may read; task_prolog.sh hands it to the job's tasks, epilog.sh revokes it.
#
# Settings (environment, or /etc/wormhole/slurm.env): WH (the wh binary), WORMHOLE_SOCKET (the
# node's server), WORMHOLE_SLURM_TOKENS (token directory, default /run/wormhole/slurm).
# A failure here makes Slurm hold the job rather than run it without its quota.
set -eu
[ -r /etc/wormhole/slurm.env ] && . /etc/wormhole/slurm.env
WH=${WH:-wh}
TOKENS=${WORMHOLE_SLURM_TOKENS:-/run/wormhole/slurm}

# The job's per-node request, e.g. "gres:whmem:10G" (among others, comma-separated).
tres=$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/.*TresPerNode=\([^ ]*\).*/\1/p')
size=$(echo "$tres" | tr ',' '\n' | sed -n 's/^gres:whmem:\([0-9][0-9]*[KMGT]\{0,1\}\)$/\1/p')
[ -n "$size" ] || exit 0

n=${size%[KMGT]}
case "$size" in
*K) bytes=$((n << 10)) ;;
*M) bytes=$((n << 20)) ;;
*G) bytes=$((n << 30)) ;;
*T) bytes=$((n << 40)) ;;
*) bytes=$n ;;
esac
mib=$(((bytes + (1 << 20) - 1) >> 20))

mkdir -p "$TOKENS"
chmod 0711 "$TOKENS"
token="$TOKENS/$SLURM_JOB_ID.token"
"$WH" tenant add "slurm-job-$SLURM_JOB_ID" --mem-quota-mib "$mib" --token-file "$token" >/dev/null
chown "$SLURM_JOB_UID" "$token"
echo "wormhole: job $SLURM_JOB_ID is tenant slurm-job-$SLURM_JOB_ID with $mib MiB" >&2
