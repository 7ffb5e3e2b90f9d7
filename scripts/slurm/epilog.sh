#!/bin/sh
# Slurm Epilog (run by slurmd as root after a job, however it ended): revokes the job's
# Wormhole tenant, which ends any session it left behind and frees its device memory.
[ -r /etc/wormhole/slurm.env ] && . /etc/wormhole/slurm.env
WH=${WH:-wh}
token="${WORMHOLE_SLURM_TOKENS:-/run/wormhole/slurm}/$SLURM_JOB_ID.token"
[ -e "$token" ] || exit 0
rm -f "$token"
# A tenant already gone is fine; any other failure leaves a live token: Slurm then drains the
# node for the operator to look at.
if ! out=$("$WH" tenant remove "slurm-job-$SLURM_JOB_ID" 2>&1 >/dev/null); then
    case "$out" in
    *"no tenant named"*) ;;
    *) echo "wormhole: cannot revoke job $SLURM_JOB_ID's tenant: $out" >&2; exit 1 ;;
    esac
fi
