# Shared helpers for the mpifgl job scripts in jobs/. Sourced, never run or submitted.
#
# The caller has already set MPIFGL_HOME (the repository root) and `set -euo pipefail`.
# Everything here is plain bash; nothing is executed when DRY_RUN=1 except checks and printing.
# shellcheck disable=SC2034  # the *_ARGV arrays filled here are read by the job scripts

# ---- messages --------------------------------------------------------------------------------
JOB_TAG=${JOB_TAG:-$(basename "${BASH_SOURCE[1]:-job}")}

die() {
  printf '%s: error: %s\n' "$JOB_TAG" "$*" >&2
  exit 2
}

note() {
  printf '%s: %s\n' "$JOB_TAG" "$*" >&2
}

# ---- checking variables ----------------------------------------------------------------------
# require_set NAME [hint]: NAME must be set and non-empty.
require_set() {
  local name=$1 hint=${2:-}
  [ -n "${!name:-}" ] || die "$name is required but not set${hint:+ ($hint)}"
}

# require_uint NAME [min]: NAME must be a whole number >= min (default 0).
require_uint() {
  local name=$1 min=${2:-0} value=${!1-}
  [[ "$value" =~ ^[0-9]+$ ]] || die "$name='$value' is not a whole number"
  (( 10#$value >= min )) || die "$name=$value must be at least $min"
}

# require_choice NAME choice...: NAME must be one of the choices.
require_choice() {
  local name=$1 value=${!1-} choice
  shift
  for choice in "$@"; do
    [ "$value" = "$choice" ] && return 0
  done
  die "$name='$value' is not one of: $*"
}

# require_bool NAME: NAME must be 0 or 1.
require_bool() {
  require_choice "$1" 0 1
}

# require_dir NAME: NAME must name an existing directory.
require_dir() {
  local name=$1 value=${!1-}
  [ -d "$value" ] || die "$name='$value' is not a directory"
}

# ---- running commands ------------------------------------------------------------------------
# show_cmd CMD...: print "+ CMD" quoted so that a shell reads it back as the same words.
show_cmd() {
  local out="" word
  for word in "$@"; do
    if [[ "$word" =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then
      out+="$word "
    else
      out+="'${word//\'/\'\\\'\'}' "
    fi
  done
  printf '+ %s\n' "${out% }"
}

# run CMD...: print the command, then run it unless DRY_RUN=1.
run() {
  show_cmd "$@"
  [ "${DRY_RUN:-0}" = 1 ] && return 0
  "$@"
}

# run_export NAME=VALUE...: export variables; printed as a command so DRY_RUN shows them too.
run_export() {
  show_cmd export "$@"
  local assignment
  for assignment in "$@"; do
    export "${assignment?}"
  done
}

# ---- python environment ----------------------------------------------------------------------
# check_venv: resolve VENV (default $MPIFGL_HOME/.venv; "none" = the python3 already on PATH,
# for site modules or conda) and PYTHON, and check they exist. Prints nothing.
check_venv() {
  VENV=${VENV:-$MPIFGL_HOME/.venv}
  if [ "$VENV" = none ]; then
    PYTHON=${PYTHON:-python3}
    command -v "$PYTHON" >/dev/null || die "VENV=none but PYTHON='$PYTHON' is not on PATH"
  else
    [ -f "$VENV/bin/activate" ] \
      || die "VENV='$VENV' is not a virtualenv (no bin/activate); run scripts/setup.sh or set VENV"
    PYTHON=${PYTHON:-$VENV/bin/python}
  fi
}

# activate_venv: source VENV/bin/activate (after check_venv).
activate_venv() {
  [ "$VENV" = none ] && return 0
  show_cmd source "$VENV/bin/activate"
  # activate scripts may reference unset variables; relax -u while sourcing
  set +u
  # shellcheck disable=SC1091
  source "$VENV/bin/activate"
  set -u
}

# Default data root: the repo's ../shared/data when present (the layout on the dev machines).
default_data_root() {
  local shared
  shared=$(cd "$MPIFGL_HOME/.." && pwd)/shared/data
  if [ -d "$shared" ]; then
    printf '%s\n' "$shared"
  else
    printf '%s\n' "$MPIFGL_HOME/data"
  fi
}

# The partitions data_prep knows (python -m data_prep --help); file:PATH names an assignment file.
DATA_PREP_PARTITIONS="random label-skew metis dirichlet louvain file:PATH"

# require_partition: PARTITION must be one of DATA_PREP_PARTITIONS (file: with a readable file).
require_partition() {
  case "${PARTITION-}" in
    random|label-skew|metis|dirichlet|louvain) return 0 ;;
    file:?*) [ -r "${PARTITION#file:}" ] && return 0
             die "PARTITION='$PARTITION': the assignment file '${PARTITION#file:}' is not readable" ;;
  esac
  die "PARTITION='${PARTITION-}' is not one of: $DATA_PREP_PARTITIONS"
}

# check_data_prep_vars SEEDVAR: check DATASET or GRAPH (exactly one), NUM_CLIENTS, PARTITION,
# the partition seed in the variable named SEEDVAR, DATA_ROOT, SHARD_DIR and FORCE.
check_data_prep_vars() {
  if [ -n "${GRAPH:-}" ]; then
    [ -z "${DATASET:-}" ] || die "DATASET='$DATASET' and GRAPH='$GRAPH' are both set: expected" \
      "one of them (a dataset of the catalog, or your own graph)"
    [ -e "$GRAPH" ] || die "GRAPH='$GRAPH' does not exist: expected an .npz, a .pt or an OGB" \
      "folder (docs/data_prep.md)"
  else
    require_set DATASET "e.g. DATASET=cora, or GRAPH=/path/graph.npz; see python -m data_prep --help"
  fi
  require_uint NUM_CLIENTS 1
  require_partition
  require_uint "$1"
  require_set SHARD_DIR
  require_bool FORCE
  if [ -z "${GRAPH:-}" ] && [ "$DATASET" != synthetic ]; then
    require_dir DATA_ROOT
  fi
}

# graph_name: the name the shards carry: DATASET, else GRAPH_NAME, else GRAPH's file stem (as
# data_prep's --graph-name default).
graph_name() {
  if [ -n "${GRAPH:-}" ]; then
    local stem
    stem=$(basename "${GRAPH%/}")
    echo "${GRAPH_NAME:-${stem%%.*}}"
  else
    echo "$DATASET"
  fi
}

# default_shard_dir SEEDVAR: print the default shard directory for the graph, PARTITION,
# NUM_CLIENTS and the seed in the variable SEEDVAR, relative to the repository root. Python
# computes it (fgl_common.shard_format.default_shard_dir), so data_prep, mpifgl.train and the scripts share
# one name (after check_venv); file:PATH partitions are named "file".
default_shard_dir() {
  local partition=$PARTITION
  case "$partition" in file:*) partition=file ;; esac
  (cd "$MPIFGL_HOME" && "$PYTHON" -c 'import sys
from fgl_common.shard_format import default_shard_dir
print(default_shard_dir(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])))' \
    "$(graph_name)" "$NUM_CLIENTS" "$partition" "${!1}") \
    || die "cannot compute the default SHARD_DIR with $PYTHON; set SHARD_DIR"
}

# data_prep_argv SEEDVAR: fill the array DATA_PREP_ARGV with the data_prep command (after
# check_data_prep_vars and check_venv); DATA_PREP_FLAGS (word-split) adds flags, e.g. --beta 0.5.
data_prep_argv() {
  local seed=${!1}
  # MPIFGL_DATA_PREP_CMD replaces "python -m data_prep" (word-split; for tests and wrappers)
  local -a base flags
  read -r -a base <<< "${MPIFGL_DATA_PREP_CMD:-$PYTHON -m data_prep}"
  read -r -a flags <<< "${DATA_PREP_FLAGS:-}"
  local -a graph=(--dataset "${DATASET:-}") root=(--data-root "${DATA_ROOT:-}")
  if [ -n "${GRAPH:-}" ]; then
    graph=(--graph "$GRAPH")
    [ -z "${GRAPH_NAME:-}" ] || graph+=(--graph-name "$GRAPH_NAME")
    root=()
  fi
  DATA_PREP_ARGV=("${base[@]}" "${graph[@]}" --num-clients "$NUM_CLIENTS" --partition
                  "$PARTITION" --seed "$seed" "${root[@]}" --out "$SHARD_DIR" "${flags[@]}")
  [ "$FORCE" = 1 ] && DATA_PREP_ARGV+=(--force)
  return 0
}

# note_existing_shards: say when SHARD_DIR already holds shards, which data_prep refuses to
# replace without FORCE=1 (a dry run shows it before the job is queued).
note_existing_shards() {
  if [ -f "$SHARD_DIR/manifest.json" ] && [ "$FORCE" != 1 ]; then
    note "SHARD_DIR=$SHARD_DIR already holds shards (manifest.json); data_prep will refuse" \
         "to replace them: use them as they are, or set FORCE=1"
  fi
  return 0
}

# note_existing_run ARGS...: say when RUN_DIR already holds a run, which mpifgl.train refuses
# without --force or --resume among ARGS (its run files: mpifgl/runlog.py OUTPUT_NAMES).
note_existing_run() {
  local name found=""
  for name in config.json metrics.jsonl final.json model.pt logits.npy checkpoint.pt; do
    [ -e "$RUN_DIR/$name" ] && found+="${found:+, }$name"
  done
  [ -n "$found" ] || return 0
  case " $* " in *" --force "*|*" --resume "*) return 0 ;; esac
  note "RUN_DIR=$RUN_DIR already holds a run ($found); mpifgl.train will refuse it: choose" \
       "another RUN_DIR, or add --force (overwrite) or --resume RUN_DIR to EXTRA_ARGS"
}

# manifest_num_clients DIR: print num_clients from DIR/manifest.json.
manifest_num_clients() {
  "$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["num_clients"])' \
    "$1/manifest.json" || die "cannot read num_clients from $1/manifest.json"
}

# ---- MPI launch ------------------------------------------------------------------------------
# srun_has_pmix: true when we are inside a SLURM allocation and srun offers --mpi=pmix.
srun_has_pmix() {
  [ -n "${SLURM_JOB_ID:-}" ] || return 1
  command -v srun >/dev/null || return 1
  timeout 20 srun --mpi=list 2>&1 | grep -qw pmix
}

# check_mpi_launcher: resolve MPI_LAUNCHER (auto|srun|mpirun; auto = srun when inside an
# allocation whose srun offers pmix, else mpirun), SRUN_MPI (default pmix) and MPIRUN (default
# the venv's mpirun, else mpirun on PATH), and check the launcher exists. Prints nothing to stdout.
check_mpi_launcher() {
  MPI_LAUNCHER=${MPI_LAUNCHER:-auto}
  require_choice MPI_LAUNCHER auto srun mpirun
  if [ "$MPI_LAUNCHER" = auto ]; then
    if srun_has_pmix; then MPI_LAUNCHER=srun; else MPI_LAUNCHER=mpirun; fi
    note "MPI_LAUNCHER=auto chose $MPI_LAUNCHER"
  fi
  if [ "$MPI_LAUNCHER" = srun ]; then
    command -v srun >/dev/null || die "MPI_LAUNCHER=srun but srun is not on PATH"
    SRUN_MPI=${SRUN_MPI:-pmix}
  else
    if [ -z "${MPIRUN:-}" ]; then
      if [ "$VENV" != none ] && [ -x "$VENV/bin/mpirun" ]; then
        MPIRUN=$VENV/bin/mpirun
      else
        MPIRUN=mpirun
      fi
    fi
    command -v "$MPIRUN" >/dev/null || die "MPI_LAUNCHER=mpirun but MPIRUN='$MPIRUN' is not found"
  fi
}

# mpi_launch_argv NRANKS: fill MPI_LAUNCH_ARGV with the launcher prefix for NRANKS ranks and
# export what the launcher needs (after check_mpi_launcher).
mpi_launch_argv() {
  local nranks=$1
  if [ "$MPI_LAUNCHER" = srun ]; then
    # --kill-on-bad-exit: one failing rank ends the step instead of leaving the others hanging
    MPI_LAUNCH_ARGV=(srun "--mpi=$SRUN_MPI" --kill-on-bad-exit=1 -n "$nranks")
  else
    mpirun_env
    MPI_LAUNCH_ARGV=("$MPIRUN" -n "$nranks")
  fi
}

# mpirun_env: export the Open MPI launch environment (fgl_common/launch.py: oversubscription, and
# running as root when we are root; a value already set wins), printed like commands. Run from
# the repository so python finds fgl_common even before the checkout is installed.
mpirun_env() {
  local exports line
  exports=$(cd "$MPIFGL_HOME" && "$PYTHON" -m fgl_common.launch --shell) \
    || die "cannot read the MPI launch environment with $PYTHON -m fgl_common.launch --shell"
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    local -a assignments
    eval "assignments=(${line#export })"  # the values are shell-quoted by fgl_common.launch
    run_export "${assignments[@]}"
  done <<< "$exports"
}
