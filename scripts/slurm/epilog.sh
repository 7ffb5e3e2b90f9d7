#!/bin/sh
# Slurm Epilog (run by slurmd as root after a job, however it ended): revokes the job's
# Wormhole tenant, which ends any session it left behind and frees its device memory. The
# token file goes only once the tenant is revoked; a tenant already gone is fine. Any other
# failure leaves a live token: Slurm then drains the node for the operator to look at.
env_file=${WORMHOLE_SLURM_ENV:-/etc/wormhole/slurm.env}
if [ -r "$env_file" ]; then set -a; . "$env_file"; set +a; fi
WH=${WH:-wh}
token="${WORMHOLE_SLURM_TOKENS:-/run/wormhole/slurm}/$SLURM_JOB_ID.token"
# Only jobs that asked for whmem have a tenant: those with a token file, or whose request
# says so (the job is still listed while it completes).
if [ ! -e "$token" ] &&
    ! squeue -h -j "$SLURM_JOB_ID" -o %b | tr ',' '\n' | grep -qE '^gres[:/]whmem([:=]|$)'; then
    exit 0
fi
if ! out=$("$WH" tenant remove "slurm-job-$SLURM_JOB_ID" ${WORMHOLE_SOCKET:+--socket "$WORMHOLE_SOCKET"} 2>&1 >/dev/null); then
    case "$out" in
    *"no tenant named"*) ;;
    *) echo "wormhole: cannot revoke job $SLURM_JOB_ID's tenant: $out" >&2; exit 1 ;;
    esac
fi
rm -f "$token"
