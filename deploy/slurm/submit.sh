#!/bin/bash
# Submits an eps job after the job that prepares its data, with Slurm job
# dependencies:
#
#   deploy/slurm/submit.sh PREPARE_SCRIPT [JOB.ini]
#
# PREPARE_SCRIPT (a batch script of yours: it writes data.train and
# data.eval) runs first; eps.sbatch starts only once it succeeded
# (--dependency=afterok), and a report job runs after eps whatever its end
# (--dependency=afterany), printing the final status. The worker jobs are
# submitted by the master itself, while it runs.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
prepare="${1:?usage: submit.sh PREPARE_SCRIPT [JOB.ini]}"
config="$(realpath "${2:-$here/job.ini}")"
dir="${EPS_DIR:-$PWD/eps-ctr}"

prepare_id=$(sbatch --parsable "$prepare")
eps_id=$(EPS_CONFIG="$config" EPS_DIR="$dir" sbatch --parsable --export=ALL \
  --dependency="afterok:$prepare_id" "$here/eps.sbatch")
report_id=$(sbatch --parsable --partition=cpu --ntasks=1 --dependency="afterany:$eps_id" \
  --job-name=eps-report --output="%x-%j.out" \
  --wrap="cat '$dir/master/final_status.json' || echo 'no final status: the job did not finish; see its log'")
echo "data: $prepare_id, eps: $eps_id (after $prepare_id), report: $report_id (after $eps_id)"
