#!/bin/sh
# Slurm Prolog (run by slurmd as root before a job starts on a node): a job that asked for
# Wormhole device memory (--gres=whmem:SIZE, SIZE in bytes with K/M/G/T suffixes of 1024)
# becomes the Wormhole tenant slurm-job-<id> with exactly that quota. Its token goes to a file
# only the job's user may read; task_prolog.sh hands it to the job's tasks, epilog.sh revokes
# it. Any failure here makes Slurm hold the job rather than run it without its quota.
#
# Settings (environment, or the file $WORMHOLE_SLURM_ENV, default /etc/wormhole/slurm.env):
# WH (the wh binary), WORMHOLE_SOCKET (the node's server), WORMHOLE_SLURM_TOKENS (the token
# directory, default /run/wormhole/slurm).
set -eu
env_file=${WORMHOLE_SLURM_ENV:-/etc/wormhole/slurm.env}
if [ -r "$env_file" ]; then set -a; . "$env_file"; set +a; fi
WH=${WH:-wh}
TOKENS=${WORMHOLE_SLURM_TOKENS:-/run/wormhole/slurm}
tenant="slurm-job-$SLURM_JOB_ID"
wh() { "$WH" "$@" ${WORMHOLE_SOCKET:+--socket "$WORMHOLE_SOCKET"}; }

# The job's per-node request, and only that field (names, comments and paths are the user's):
# "gres:whmem:10G" (Slurm 22.05) or "gres/whmem:10G", among others, comma-separated.
tres=$(squeue -h -j "$SLURM_JOB_ID" -o %b)
fields=$(echo "$tres" | tr ',' '\n' | grep -E '^gres[:/]whmem([:=]|$)' || true)
[ -n "$fields" ] || exit 0
size=$(echo "$fields" | sed -n 's/^gres[:/]whmem[:=]\([0-9]\{1,12\}[KMGT]\{0,1\}\)$/\1/p')
if [ -z "$size" ] || [ "$(echo "$fields" | wc -l)" -ne 1 ]; then
    echo "wormhole: job $SLURM_JOB_ID: cannot read its whmem request from '$tres'" >&2
    exit 1
fi
n=${size%[KMGT]}
case "$size" in
*K) mib=$(((n + 1023) / 1024)) ;;
*M) mib=$n ;;
*G) mib=$((n * 1024)) ;;
*T) mib=$((n * 1024 * 1024)) ;;
*) mib=$(((n + 1048575) / 1048576)) ;;
esac

mkdir -p "$TOKENS"
chmod 0711 "$TOKENS"
token="$TOKENS/$SLURM_JOB_ID.token"
# A tenant of the same name left behind (a requeued job, an epilog that could not reach the
# server) is revoked first: a job never inherits an earlier token.
if ! out=$(wh tenant remove "$tenant" 2>&1 >/dev/null); then
    case "$out" in *"no tenant named"*) ;; *) echo "wormhole: $out" >&2; exit 1 ;; esac
fi
wh tenant add "$tenant" --mem-quota-mib "$mib" --token-file "$token" >/dev/null
chown "$SLURM_JOB_UID" "$token"
echo "wormhole: job $SLURM_JOB_ID is tenant $tenant with $mib MiB" >&2
