#!/usr/bin/env bash
# CLI boundary test for the berth binary: every bad input exits non-zero (without crashing), prints
# a message that names the problem, and leaves no output behind (no target file or run directory,
# no *.tmp.* temporaries). Plus the positive paths: --version, `data info`, a 3-step training run
# whose saved config.toml is accepted again by `berth train`.
#
# Usage: bad_input.sh PATH_TO_BERTH   (ctest: cli_bad_input)
# Prints one line per check ("NAME ... ok" / "NAME ... FAIL: why"), then "N passed, M failed".
set -u

BERTH=${1:?usage: bad_input.sh PATH_TO_BERTH}
BERTH="$(cd "$(dirname "$BERTH")" && pwd)/$(basename "$BERTH")"  # absolute: some checks cd
SRC_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TINY_TOML="$SRC_DIR/configs/tiny.toml"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/berth_cli.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
log="$tmp/last.log"
passed=0
failed=0

# ---- helpers -------------------------------------------------------------------------------------

# report NAME WHY: WHY empty = ok.
report() {
  if [ -z "$2" ]; then
    echo "$1 ... ok"
    passed=$((passed + 1))
  else
    echo "$1 ... FAIL:$2"
    echo "    --- output of the last command ---"
    sed 's/^/    /' "$log" | head -20
    failed=$((failed + 1))
  fi
}

# Appends to the global `why` the temporaries left under $tmp (files *.tmp.*, checkpoint
# directories step-N.tmp-PID), and removes them so the next check starts clean.
check_no_temporaries() {
  local left
  left=$(find "$tmp" \( -name '*.tmp.*' -o -name '*.tmp-*' \) -print)
  if [ -n "$left" ]; then
    why+=" left temporaries: $(echo "$left" | tr '\n' ' ')"
    find "$tmp" \( -name '*.tmp.*' -o -name '*.tmp-*' \) -prune -exec rm -rf {} +
  fi
}

# expect_error NAME PHRASE MUST_NOT_EXIST CMD...
#   CMD must exit with a non-zero status below 128 (an error, not a crash), its stdout+stderr must
#   contain PHRASE (fixed string), MUST_NOT_EXIST (a path, or "") must not exist afterwards, and no
#   *.tmp.* file may be left under $tmp.
expect_error() {
  local name=$1 phrase=$2 target=$3
  shift 3
  "$@" >"$log" 2>&1
  local rc=$?
  why=""
  if [ "$rc" -eq 0 ]; then
    why+=" exit status 0, expected an error"
  elif [ "$rc" -ge 128 ]; then
    why+=" exit status $rc (crashed/killed), expected a clean error"
  fi
  grep -qF -- "$phrase" "$log" || why+=" output lacks '$phrase'"
  if [ -n "$target" ] && [ -e "$target" ]; then
    why+=" left output $target"
    rm -rf "$target"
  fi
  check_no_temporaries
  report "$name" "$why"
}

# Tiny shapes on top of configs/tiny.toml: trains 3 steps in well under a second on 2 cores.
TINY_SETS=(--set model.n_layer=1 --set model.d_model=32 --set model.n_head=2
           --set model.max_seq_len=16 --set data.seq_len=16 --set train.micro_batch_size=2
           --set train.steps=3 --set eval.interval=0 --set 'data.val=""'
           --set "run.out_dir=$tmp/runs")

# train_tiny RUN_NAME [more args...]: `berth train configs/tiny.toml` with the tiny shapes, the
# dataset made below, run.name = RUN_NAME; the run directory is $tmp/runs/RUN_NAME.
train_tiny() {
  local run_name=$1
  shift
  "$BERTH" train "$TINY_TOML" "${TINY_SETS[@]}" --set "data.train=$tmp/d.h5" \
    --set "run.name=$run_name" "$@"
}

# in_dir DIR CMD...: CMD (a function too) run from DIR.
in_dir() {
  (cd "$1" && shift && "$@")
}

# ---- fixtures ------------------------------------------------------------------------------------

# Two text documents (byte tokens, vocab 257): 300 + 200 bytes, + one EOT each = 502 tokens.
head -c 300 /dev/zero | tr '\0' 'a' >"$tmp/doc1.txt"
head -c 200 /dev/zero | tr '\0' 'b' >"$tmp/doc2.txt"
mkdir -p "$tmp/runs"

"$BERTH" data import --format text "$tmp/doc1.txt" "$tmp/doc2.txt" --out "$tmp/d.h5" >"$log" 2>&1
rc=$?
why=""
[ "$rc" -eq 0 ] || why+=" exit status $rc"
[ -f "$tmp/d.h5" ] || why+=" $tmp/d.h5 not written"
check_no_temporaries
report "data_import_text" "$why"
if [ ! -f "$tmp/d.h5" ]; then
  echo "cannot continue without the dataset"
  echo "$passed passed, $((failed + 1)) failed"
  exit 1
fi

# ---- positive paths ------------------------------------------------------------------------------

"$BERTH" --version >"$log" 2>&1
rc=$?
why=""
[ "$rc" -eq 0 ] || why+=" exit status $rc"
grep -q '^berth [0-9]' "$log" || why+=" output does not start with 'berth <version>'"
report "version" "$why"

"$BERTH" data info "$tmp/d.h5" >"$log" 2>&1
rc=$?
why=""
[ "$rc" -eq 0 ] || why+=" exit status $rc"
grep -Eq '^documents +2$' "$log" || why+=" no 'documents 2' line"
grep -Eq '^tokens +502$' "$log" || why+=" no 'tokens 502' line"
grep -Eq '^vocab +257 ' "$log" || why+=" no 'vocab 257' line"
report "data_info" "$why"

# An evaluation's loss reaches the console even when its step is not a log_interval step (steps
# 1, 5 are; the evaluations are after steps 3 and 6).
train_tiny evallog --set train.steps=6 --set eval.interval=3 --set train.log_interval=4 \
  --set "data.val=$tmp/d.h5" --set eval.batches=1 >"$log" 2>&1
rc=$?
why=""
[ $rc -eq 0 ] || why+=" exit $rc"
grep -Eq 'step +3/6 .*\| val loss [0-9.]+$' "$log" || why+=" no step 3 line with its val loss"
grep -Eq 'step +5/6 ' "$log" || why+=" no step 5 line (log_interval)"
[ "$(grep -Ec 'val loss (before training )?[0-9]' "$log")" -eq 3 ] ||
  why+=" not 3 val losses (before, 3, 6)"
report "eval_steps_are_logged" "$why"

run_dir="$tmp/runs/tiny3"
train_tiny tiny3 >"$log" 2>&1
rc=$?
why=""
[ "$rc" -eq 0 ] || why+=" exit status $rc"
[ -f "$run_dir/config.toml" ] || why+=" no config.toml"
if [ -f "$run_dir/metrics.jsonl" ]; then
  lines=$(wc -l <"$run_dir/metrics.jsonl")
  [ "$lines" -eq 3 ] || why+=" metrics.jsonl has $lines lines, expected 3"
  for k in 1 2 3; do
    sed -n "${k}p" "$run_dir/metrics.jsonl" | grep -q "\"step\":${k}[,}]" ||
      why+=" metrics line $k lacks \"step\":$k"
  done
else
  why+=" no metrics.jsonl"
fi
[ -e "$run_dir/metrics.jsonl.partial" ] && why+=" metrics.jsonl.partial left behind"
check_no_temporaries
report "train_3_steps" "$why"

# A session of one step: plan vs measured shows that step's time (it read 0.000 s).
train_tiny one_step --set train.steps=1 --set train.warmup_steps=0 >"$log" 2>&1
rc=$?
report "plan_vs_measured_one_step" "$([ $rc -eq 0 ] &&
  grep -qE "measured [0-9]+\.[0-9]{3} s \(the session's only step" "$log" ||
  echo " rc $rc, or no step time")"

# A training set of fewer rows than one step takes trains (repeating rows), with a warning.
printf 'tiny doc' >"$tmp/tiny_doc.txt"
"$BERTH" data import --format text "$tmp/tiny_doc.txt" --out "$tmp/tiny_doc.h5" >/dev/null 2>&1
train_tiny tiny_train --set "data.train=$tmp/tiny_doc.h5" --set data.mode=packed >"$log" 2>&1
rc=$?
report "train_set_below_one_step_warns" "$([ $rc -eq 0 ] &&
  grep -qF "holds 1 rows of 16 tokens, fewer than one step takes (2 rows" "$log" ||
  echo " rc $rc, or no warning")"
# The plan's layout table says how many layouts it left out.
"$BERTH" plan "$TINY_TOML" --gpus 8 >"$log" 2>&1
rc=$?
report "plan_table_says_what_it_hides" "$([ $rc -eq 0 ] && grep -qE "^  \.\.\. [0-9]+ more \([0-9]+ that fit, [0-9]+ rejected\): --json lists every layout" "$log" ||
  echo " rc $rc, or no note")"

# An evaluation of more rows than data.val holds at every layout: the plan says so (not memory).
"$BERTH" plan "$TINY_TOML" "${TINY_SETS[@]}" --set "data.train=$tmp/d.h5" --set "data.val=$tmp/d.h5" \
  --set eval.interval=1 --set eval.batches=100000 >"$log" 2>&1
rc=$?
report "plan_eval_rows_fit_no_layout" "$([ $rc -eq 0 ] && grep -qF "each one's evaluation reads more rows of data.val than it holds" "$log" ||
  echo " rc $rc, or no such summary")"
# A packed run whose cp does not divide seq_len / 2: the layout's error, not the packer's.
expect_error "plan_packed_cp_not_dividing" "cannot run this model: seq_len (16) is not divisible by 2·cp (6)" "" \
  "$BERTH" plan "$TINY_TOML" "${TINY_SETS[@]}" --set "data.train=$tmp/d.h5" --set data.mode=packed \
  --set parallel.cp=3 --gpus 3

# A warm-up longer than the run is a mistake worth a warning (the peak LR is never used).
train_tiny long_warmup --set train.warmup_steps=10 >"$log" 2>&1
rc=$?
why=""
[ "$rc" -eq 0 ] || why+=" exit status $rc"
grep -qF "train.warmup_steps = 10 > train.steps = 3: the learning rate never reaches" "$log" ||
  why+=" no warm-up warning"
report "warmup_longer_than_run_warns" "$why"

# The saved config is a complete, valid config: training from it works and resolves to the same
# config (only run.name differs, by override).
"$BERTH" train "$run_dir/config.toml" --set run.name=again >"$log" 2>&1
rc=$?
why=""
[ "$rc" -eq 0 ] || why+=" exit status $rc"
if [ -f "$tmp/runs/again/config.toml" ] && [ -f "$run_dir/config.toml" ]; then
  diff <(grep -v '^name = ' "$run_dir/config.toml") \
       <(grep -v '^name = ' "$tmp/runs/again/config.toml") >/dev/null ||
    why+=" re-resolved config differs from the saved one"
  grep -q '^name = "again"$' "$tmp/runs/again/config.toml" || why+=" run.name override not saved"
else
  why+=" no config.toml in the re-run"
fi
[ -f "$tmp/runs/again/metrics.jsonl" ] && [ "$(wc -l <"$tmp/runs/again/metrics.jsonl")" -eq 3 ] ||
  why+=" re-run metrics.jsonl missing or not 3 lines"
check_no_temporaries
report "train_from_saved_config" "$why"

# ---- config errors -------------------------------------------------------------------------------

# (from a directory of its own: a run's default out_dir is runs/ under the working directory)
mkdir -p "$tmp/nocfg"
expect_error "config_missing" "config file '$tmp/nope.toml' not found" "$tmp/nocfg/runs" \
  in_dir "$tmp/nocfg" "$BERTH" train "$tmp/nope.toml"

printf '[run]\nname = "unknown_key"\nout_dir = "%s/runs"\n[train]\nlrr = 3e-4\n' "$tmp" \
  >"$tmp/unknown_key.toml"
expect_error "config_unknown_key" "unknown key 'train.lrr' (line 5)" "$tmp/runs/unknown_key" \
  "$BERTH" train "$tmp/unknown_key.toml"

printf '[run]\nname = "wrong_type"\nout_dir = "%s/runs"\n[train]\nsteps = "ten"\n' "$tmp" \
  >"$tmp/wrong_type.toml"
expect_error "config_wrong_type" "train.steps must be an integer, got string \"ten\"" \
  "$tmp/runs/wrong_type" "$BERTH" train "$tmp/wrong_type.toml"

expect_error "set_unknown_key" "unknown key 'train.foo'" "$tmp/runs/set_unknown_key" \
  train_tiny set_unknown_key --set train.foo=1

expect_error "set_malformed" "is malformed: expected section.key=value" "$tmp/runs/set_malformed" \
  train_tiny set_malformed --set train.lr

expect_error "seq_len_above_max_seq_len" "data.seq_len (32) > model.max_seq_len (16)" \
  "$tmp/runs/seq_len_above_max" train_tiny seq_len_above_max --set data.seq_len=32

expect_error "micro_batch_size_zero" "train.micro_batch_size must be > 0, got 0" \
  "$tmp/runs/mbs_zero" train_tiny mbs_zero --set train.micro_batch_size=0

expect_error "micro_batch_size_negative" "train.micro_batch_size must be > 0, got -3" \
  "$tmp/runs/mbs_negative" train_tiny mbs_negative --set train.micro_batch_size=-3

expect_error "steps_zero" "train.steps must be > 0, got 0" "$tmp/runs/steps_zero" \
  train_tiny steps_zero --set train.steps=0

# reservation.without = "refuse" refuses a run with no reservation (exit 4), with or without a
# ledger (a missing one said only that it does not exist).
BERTH_LEDGER="$tmp/no_ledger_here/ledger.db" train_tiny refuse_without \
  --set reservation.without=refuse >"$log" 2>&1
rc=$?
report "train_without_reservation_refused" "$([ $rc -eq 4 ] || echo " exit $rc, expected 4")$(
  grep -q 'no reservation: this config requires one' "$log" || echo " no refusal message")$(
  [ -e "$tmp/runs/refuse_without" ] && echo " left a run directory")"

# reservation.without = "on-demand": a short P3 booking of the devices free now, held while the
# run trains and cancelled when it ends.
mkdir -p "$tmp/od"
BERTH_LEDGER="$tmp/od/ledger.db" "$BERTH" devices register --cpu-slots 1 >/dev/null 2>&1
BERTH_LEDGER="$tmp/od/ledger.db" train_tiny on_demand --set reservation.without=on-demand \
  >"$log" 2>&1
rc=$?
report "train_on_demand_books_trains_and_cancels" "$([ $rc -eq 0 ] || echo " exit $rc")$(
  grep -q 'lease: booked reservation 1 on demand (P3, 1h00m)' "$log" || echo " no booking line")$(
  BERTH_LEDGER="$tmp/od/ledger.db" "$BERTH" reservation show 1 2>&1 | grep -q cancelled ||
  echo " the booking was not cancelled")"
# One no longer than the stop reserve could run no step: refused before booking anything.
expect_error "train_on_demand_shorter_than_the_stop_reserve" \
  "reservation.on_demand_s = 60 s is no longer than the stop reserve a leased run keeps" \
  "$tmp/runs/od_short" env BERTH_LEDGER="$tmp/od/ledger.db" "$BERTH" train "$TINY_TOML" \
  "${TINY_SETS[@]}" --set "data.train=$tmp/d.h5" --set run.name=od_short \
  --set reservation.without=on-demand --set reservation.on_demand_s=60

# ---- dataset errors at train time ----------------------------------------------------------------

expect_error "train_file_missing" "data.train '$tmp/missing.h5' does not exist; fix the path" \
  "$tmp/runs/train_missing" train_tiny train_missing --set "data.train=$tmp/missing.h5"

head -c 4096 /dev/urandom >"$tmp/garbage.h5"
expect_error "train_file_garbage" "is not a readable HDF5 file" "$tmp/runs/train_garbage" \
  train_tiny train_garbage --set "data.train=$tmp/garbage.h5"

head -c 2000 "$tmp/d.h5" >"$tmp/truncated.h5"
expect_error "train_file_truncated_hdf5" "is not a readable HDF5 file" \
  "$tmp/runs/train_truncated" train_tiny train_truncated --set "data.train=$tmp/truncated.h5"

expect_error "val_file_missing" "data.val '$tmp/missing_val.h5' does not exist" \
  "$tmp/runs/val_missing" train_tiny val_missing --set "data.val=$tmp/missing_val.h5" \
  --set eval.interval=1
# With eval.interval = 0 nothing evaluates, so data.val is not read: a missing one trains.
train_tiny val_unused --set "data.val=$tmp/missing_val.h5" >"$log" 2>&1
rc=$?
report "val_file_missing_without_evaluation_trains" "$([ $rc -eq 0 ] || echo " rc $rc")"
# A relative path is read from the current directory, not the config's: the message says which.
expect_error "train_file_relative_elsewhere" "data.train 'data/nowhere.h5' does not exist (a relative path is read from the current directory, $tmp, not from the config's)" \
  "$tmp/runs/relative" in_dir "$tmp" train_tiny relative --set "data.train=data/nowhere.h5"

expect_error "dataset_vocab_above_model_vocab" "raise model.vocab_size to at least 257" \
  "$tmp/runs/vocab_small" train_tiny vocab_small --set model.vocab_size=100

# A dataset with fewer than seq_len + 1 tokens (10 bytes + EOT = 11 tokens < 17).
printf '0123456789' >"$tmp/short.txt"
"$BERTH" data import --format text "$tmp/short.txt" --out "$tmp/short.h5" >/dev/null 2>&1
expect_error "dataset_shorter_than_one_window" "fewer than data.seq_len + 1 = 17" \
  "$tmp/runs/short" train_tiny short --set "data.train=$tmp/short.h5"

# run.out_dir below a regular file: mkdir fails even for root (chmod would not stop root).
: >"$tmp/afile"
expect_error "out_dir_under_a_file" "cannot create run directory" "$tmp/afile/sub" \
  train_tiny unwritable --set "run.out_dir=$tmp/afile/sub"
# checkpoint.dir likewise, before the first step (not at the first save, after the steps)
expect_error "checkpoint_dir_under_a_file" "cannot create checkpoint directory" \
  "$tmp/runs/ckdir" \
  train_tiny ckdir --set "checkpoint.dir=$tmp/afile/ck"

# ---- data import / info errors -------------------------------------------------------------------

expect_error "import_input_missing" "File does not exist" "$tmp/x_missing.h5" \
  "$BERTH" data import --format text "$tmp/no_such.txt" --out "$tmp/x_missing.h5"

expect_error "import_val_fraction_without_val_out" "--val-out and --val-fraction go together" \
  "$tmp/x_frac.h5" \
  "$BERTH" data import --format text "$tmp/doc1.txt" --out "$tmp/x_frac.h5" --val-fraction 0.5

expect_error "import_val_out_without_val_fraction" "--val-out and --val-fraction go together" \
  "$tmp/x_vout.h5" \
  "$BERTH" data import --format text "$tmp/doc1.txt" --out "$tmp/x_vout.h5" --val-out "$tmp/v.h5"

expect_error "import_val_fraction_out_of_range" "--val-fraction" "$tmp/x_range.h5" \
  "$BERTH" data import --format text "$tmp/doc1.txt" --out "$tmp/x_range.h5" \
  --val-out "$tmp/v_range.h5" --val-fraction 1.5

expect_error "import_val_out_is_out" "--out and --val-out are the same file" "$tmp/x_same.h5" \
  "$BERTH" data import --format text "$tmp/doc1.txt" "$tmp/doc2.txt" --out "$tmp/x_same.h5" \
  --val-out "$tmp/./x_same.h5" --val-fraction 0.5

# A file named twice, or through a link, was imported twice: a document in both splits. It is
# imported once, and the warning names the others.
ln -sf "$tmp/doc1.txt" "$tmp/doc1_link.txt"
"$BERTH" data import --format text "$tmp/doc1.txt" "$tmp/doc2.txt" "$tmp/doc1_link.txt" \
  "$tmp/doc2.txt" --out "$tmp/x_twice.h5" >"$log" 2>&1
rc=$?
why=""
[ $rc -eq 0 ] || why+=" rc $rc"
grep -qF "2 input(s) name a file already among the inputs, imported once at its first name: '$tmp/doc1_link.txt' (= '$tmp/doc1.txt'), '$tmp/doc2.txt' (named again)" "$log" ||
  why+=" no warning naming both"
grep -q "wrote $tmp/x_twice.h5: 2 documents" "$log" || why+=" not 2 documents"
report "import_same_file_twice_is_imported_once" "$why"

# llm.c token file with a zero header (magic 0), the right size for 0 tokens.
head -c 1024 /dev/zero >"$tmp/bad_magic.bin"
expect_error "import_llmc_bad_magic" "has magic 0, expected 20240520" "$tmp/x_llmc.h5" \
  "$BERTH" data import --format llmc "$tmp/bad_magic.bin" --out "$tmp/x_llmc.h5"

expect_error "import_out_under_a_file" "'$tmp/afile' is a file, not a directory" \
  "$tmp/afile/x.h5" \
  "$BERTH" data import --format text "$tmp/doc1.txt" --out "$tmp/afile/x.h5"

expect_error "data_info_missing" "does not exist" "" "$BERTH" data info "$tmp/missing.h5"
# A missing input file is a usage error (105) here too, as for every other command.
"$BERTH" data info "$tmp/missing.h5" >"$log" 2>&1
rc=$?
report "data_info_missing_exit_status" "$([ $rc -eq 105 ] || echo " exit status $rc, not 105")"

expect_error "data_info_garbage" "is not a readable HDF5 file" "" \
  "$BERTH" data info "$tmp/garbage.h5"

# ---- CLI usage errors (CLI11) --------------------------------------------------------------------

expect_error "unknown_subcommand" "unknown command 'frobnicate'; the commands are train, data" "" \
  "$BERTH" frobnicate
expect_error "unknown_top_option" "unknown option '--frob'; the commands are train" "" \
  "$BERTH" --frob
expect_error "unknown_data_subcommand" "Run with --help" "" "$BERTH" data frobnicate
expect_error "unknown_train_option" "--bogus" "$tmp/runs/bogus_option" \
  train_tiny bogus_option --bogus
expect_error "unknown_import_format" "--format: csv not in" "$tmp/x_csv.h5" \
  "$BERTH" data import --format csv "$tmp/doc1.txt" --out "$tmp/x_csv.h5"
expect_error "train_without_config" "config is required" "" "$BERTH" train

# A failed two-output import leaves neither output (both are renamed into place only together).
expect_error "import_val_out_unwritable_leaves_no_train_file" "cannot" "$tmp/x_pair.h5" \
  "$BERTH" data import --format text "$tmp/doc1.txt" "$tmp/doc2.txt" --out "$tmp/x_pair.h5" \
  --val-out "$tmp/afile/v.h5" --val-fraction 0.5
: > "$tmp/empty1.txt"
expect_error "import_only_empty_files" "hold no tokens" "$tmp/x_empty.h5" \
  "$BERTH" data import --format text "$tmp/empty1.txt" --out "$tmp/x_empty.h5"
expect_error "import_val_split_of_one_document" "needs at least 2 documents" "$tmp/x_one.h5" \
  "$BERTH" data import --format text "$tmp/doc1.txt" --out "$tmp/x_one.h5" \
  --val-out "$tmp/x_one_val.h5" --val-fraction 0.5

# A step directory without meta.json (not saved by berth) where this run saves (its final
# checkpoint, step 3) is refused before it trains, not when the save reaches it.
mkdir -p "$tmp/runs/stray/checkpoints/step-00000003"
expect_error "train_stray_step_directory" "without meta.json" "$tmp/runs/stray/config.toml" \
  train_tiny stray

# A second run into the checkpoints of a finished one is refused before it trains.
train_tiny collide --set "run.out_dir=$tmp/runs" >"$log" 2>&1
report "train_collide_first_run" "$([ $? -eq 0 ] || echo " first run failed")"
expect_error "train_collides_with_earlier_checkpoints" \
  "already holds checkpoints of an earlier run" "" \
  train_tiny collide --set "run.out_dir=$tmp/runs"
# Lines of metrics.jsonl that are not step records were dropped on resume without a word.
echo '{"step": 2, "loss": 4.1' >>"$tmp/runs/collide/metrics.jsonl"
train_tiny collide --set "run.out_dir=$tmp/runs" --set train.steps=5 --resume auto >"$log" 2>&1
rc=$?
report "train_resume_warns_of_unreadable_metrics" "$([ $rc -eq 0 ] || echo " rc $rc"
  grep -q "metrics: 1 line(s) of .*metrics.jsonl are not step records" "$log" || echo " no warning"
  [ "$(wc -l <"$tmp/runs/collide/metrics.jsonl")" -eq 5 ] || echo " not 5 step lines")"
# A step record missing from metrics.jsonl (a write that failed on a full disk) was lost on resume
# without a word: the gap is named.
grep -v '"step":2,' "$tmp/runs/collide/metrics.jsonl" >"$tmp/gap.jsonl"
mv "$tmp/gap.jsonl" "$tmp/runs/collide/metrics.jsonl"
train_tiny collide --set "run.out_dir=$tmp/runs" --set train.steps=6 --resume auto >"$log" 2>&1
rc=$?
report "train_resume_names_missing_metrics_steps" "$([ $rc -eq 0 ] || echo " rc $rc"
  grep -q "metrics: .*metrics.jsonl has no record of step(s) 2 of this run" "$log" ||
    echo " no warning"
  [ "$(wc -l <"$tmp/runs/collide/metrics.jsonl")" -eq 5 ] || echo " not 5 step lines")"
# Two runs of other names saving into one checkpoint.dir at once: the second, pointed at the
# first's checkpoints/ (as the refusal of a new run into a run directory suggests), is refused at
# start; it failed at its first save on the other's step directory, or mixed their checkpoints.
"$BERTH" train "$TINY_TOML" "${TINY_SETS[@]}" --set "data.train=$tmp/d.h5" --set run.name=sharea \
  --set train.steps=60 --set checkpoint.interval=0 --set debug.data_delay_s=0.1 >"$log.a" 2>&1 &
share_pid=$!
for _ in $(seq 100); do grep -q "resolved config" "$log.a" 2>/dev/null && break; sleep 0.1; done
expect_error "train_refuses_a_checkpoint_dir_in_use" \
  "the checkpoint directory $tmp/runs/sharea/checkpoints is in use by another \`berth train\` (pid $share_pid on" \
  "$tmp/runs/shareb" train_tiny shareb --set "checkpoint.dir=$tmp/runs/sharea/checkpoints"
report "train_checkpoint_dir_refusal_names_the_holders_run" \
  "$(grep -q "(no lease), run $tmp/runs/sharea)" "$log" || echo " the holder's run is not named")"
kill "$share_pid" 2>/dev/null
wait "$share_pid"
# A metrics.jsonl.partial.resume left by a resume that could not copy it back belongs to that run:
# a new run of the name from step 0 removes it (its resume took the stale steps for its own).
mkdir -p "$tmp/runs/staleresume"
printf '{"step":1,"stale":true}\n' >"$tmp/runs/staleresume/metrics.jsonl.partial.resume"
train_tiny staleresume >"$log" 2>&1
rc=$?
train_tiny staleresume --set train.steps=5 --resume auto >"$log" 2>&1
rc2=$?
report "train_from_step_0_drops_an_earlier_runs_resume_file" "$([ $rc -eq 0 ] || echo " rc $rc"
  [ $rc2 -eq 0 ] || echo " resume rc $rc2"
  [ ! -e "$tmp/runs/staleresume/metrics.jsonl.partial.resume" ] || echo " .resume left"
  grep -q stale "$tmp/runs/staleresume/metrics.jsonl" && echo " stale steps in metrics.jsonl"
  [ "$(wc -l <"$tmp/runs/staleresume/metrics.jsonl")" -eq 5 ] || echo " not 5 step lines")"

# More evaluation batches than the validation set holds: an error naming the most that fits, before
# any batch is held in memory (eval.batches = 20000000 grew to 14 GB).
expect_error "train_eval_batches_beyond_the_val_set" "eval.batches = 20000000 asks for" \
  "$tmp/runs/evalbig/config.toml" train_tiny evalbig --set eval.interval=1 \
  --set "data.val=$tmp/d.h5" --set eval.batches=20000000

# A file system that refuses the file where the directory looked writable (/proc, as root): the
# system's reason, not HDF5's open flags ("flags = 13, o_flags = 242").
if [ "$(id -u)" -eq 0 ]; then
  expect_error "import_where_the_file_system_refuses" \
    "(temporary for '/proc/berth_x.h5'): No such file or directory; check that the directory" "" \
    "$BERTH" data import --format text "$tmp/doc1.txt" --out /proc/berth_x.h5
fi
# A checkpoint save on a full file system (a 192 KiB tmpfs, where root may mount one): exit 1 with
# the system's reason and no temporary left; HDF5's clean-up at exit crashed on the file whose
# close had failed (exit 139).
if [ "$(id -u)" -eq 0 ] && mkdir -p "$tmp/full" &&
   mount -t tmpfs -o size=192k tmpfs "$tmp/full" 2>/dev/null; then
  expect_error "train_checkpoint_on_a_full_disk" "No space left on device (disk full" "" \
    train_tiny full --set "run.out_dir=$tmp/full" --set checkpoint.interval=2
  left=$(find "$tmp/full" -name '*.tmp-*')
  report "train_checkpoint_on_a_full_disk_leaves_no_temporary" "${left:+ left $left}"
  umount "$tmp/full"
else
  echo "train_checkpoint_on_a_full_disk ... skipped (needs root and mount -t tmpfs)"
fi
# A ledger on a full file system, then on a read-only one: what happened and what to do, not
# SQLite's "COMMIT: database or disk is full", nor "choose another directory" (a ledger there
# would hold none of the bookings).
if [ "$(id -u)" -eq 0 ] && mkdir -p "$tmp/lfs" &&
   mount -t tmpfs -o size=1m tmpfs "$tmp/lfs" 2>/dev/null; then
  "$BERTH" devices register --cpu-slots 1 --ledger "$tmp/lfs/l.db" >/dev/null 2>&1
  "$BERTH" reserve --gpus 1 --duration 1h --ledger "$tmp/lfs/l.db" >/dev/null 2>&1
  dd if=/dev/zero of="$tmp/lfs/fill" bs=4k 2>/dev/null
  expect_error "ledger_on_a_full_disk" "the file system holding it " "" \
    "$BERTH" reserve --gpus 1 --duration 2h --ledger "$tmp/lfs/l.db"
  rm -f "$tmp/lfs/fill"
  mount -o remount,ro "$tmp/lfs"
  expect_error "ledger_on_a_read_only_file_system" \
    "must be writable even to read it" "" "$BERTH" reservations --ledger "$tmp/lfs/l.db"
  umount "$tmp/lfs"
else
  echo "ledger_on_a_full_disk ... skipped (needs root and mount -t tmpfs)"
fi
# A packing plan path in a directory that does not exist: a typo, refused (it only warned and
# packed in memory, so the plan the user asked for was never written).
expect_error "train_pack_plan_in_a_missing_directory" \
  "cannot write data.pack_plan '$tmp/no_such_dir/p.h5': the directory '$tmp/no_such_dir' does not exist" \
  "$tmp/runs/packdir/config.toml" train_tiny packdir --set data.mode=packed \
  --set "data.pack_plan=$tmp/no_such_dir/p.h5"
# A plan the config names, packed with other options (another seed here; another cp's alignment
# alike), is the user's: refused, not rebuilt over, with the `berth pack` command that packs it
# for this run; that command's plan then trains and is reused.
"$BERTH" pack --data "$tmp/d.h5" --seq-len 16 --seed 7 --out "$tmp/mine.plan.h5" >/dev/null 2>&1
sum_before=$(md5sum < "$tmp/mine.plan.h5")
expect_error "train_named_pack_plan_of_other_options" \
  "data.pack_plan '$tmp/mine.plan.h5' is a plan built with seed 7, expected 1337" \
  "$tmp/runs/named/config.toml" train_tiny named --set data.mode=packed \
  --set "data.pack_plan=$tmp/mine.plan.h5"
cmd=$(grep -o 'Pack it again for this run with `[^`]*`' "$log" | sed 's/.*`\(.*\)`/\1/')
why=""
[ "$(md5sum < "$tmp/mine.plan.h5")" = "$sum_before" ] || why+=" the named plan was rewritten"
[ -n "$cmd" ] && ${cmd/#berth/$BERTH} >/dev/null 2>&1 || why+=" its berth pack command failed: '$cmd'"
train_tiny named --set data.mode=packed --set "data.pack_plan=$tmp/mine.plan.h5" >"$log" 2>&1 &&
  grep -qF "reusing the plan $tmp/mine.plan.h5" "$log" || why+=" training on the repacked plan failed"
report "train_named_pack_plan_repacked_as_told_is_reused" "$why"
# --set values outside a key's range: the message names the override, not only the config file.
expect_error "train_override_out_of_range_names_the_override" \
  "(set by the override 'parallel.comm_timeout_s=1e-9')" "$tmp/runs/ct/config.toml" \
  train_tiny ct --set parallel.comm_timeout_s=1e-9

# ---- berth plan ----------------------------------------------------------------------------------
expect_error "plan_without_config" "needs a CONFIG (or --calibrate)" "" "$BERTH" plan
expect_error "plan_unknown_profile" "unknown hardware profile 'v100'" "" \
  "$BERTH" plan "$TINY_TOML" --gpu v100
echo '{"format": "berth-hardware-profile", "peak_flops": 1e12}' > "$tmp/short_profile.json"
expect_error "plan_profile_missing_a_figure" "'matmul_efficiency' must be a number" "" \
  "$BERTH" plan "$TINY_TOML" --gpu "$tmp/short_profile.json"
expect_error "plan_layout_not_matching_gpus" "does not use --gpus 3" "" \
  "$BERTH" plan "$TINY_TOML" --gpus 3 --set parallel.dp=2
expect_error "plan_inner_layout_not_dividing_gpus" "tp·pp·cp = 2·1·1 = 2 does not divide --gpus 3" \
  "" "$BERTH" plan "$TINY_TOML" --gpus 3 --set parallel.tp=2
expect_error "plan_profile_file_missing" "hardware profile file '$tmp/nowhere/p.json' does not exist" "" \
  "$BERTH" plan "$TINY_TOML" --gpu "$tmp/nowhere/p.json"
# A layout berth train refuses printed every figure, "does not fit", and exited 0.
expect_error "plan_layout_that_cannot_run" "the config's layout tp=1 pp=1 cp=3 cannot run this model: seq_len (128) is not divisible by 2·cp (6)" "" \
  "$BERTH" plan "$TINY_TOML" --set parallel.cp=3
expect_error "plan_calibrate_out_empty" "--out: empty: give a file" "" \
  "$BERTH" plan --calibrate --out ""
expect_error "plan_calibrate_out_in_missing_directory" "the directory '$tmp/nowhere' does not exist" "$tmp/nowhere" \
  "$BERTH" plan --calibrate --out "$tmp/nowhere/p.json"
# --calibrate replaces only a profile: it replaced a config named by mistake.
cp "$TINY_TOML" "$tmp/config_copy.toml"
expect_error "plan_calibrate_over_another_file" "exists and is not a hardware profile" "" \
  "$BERTH" plan --calibrate --out "$tmp/config_copy.toml"
report "plan_calibrate_other_file_kept" \
  "$(cmp -s "$TINY_TOML" "$tmp/config_copy.toml" || echo " the config was replaced")"
expect_error "plan_zero_gpus" "--gpus: 0 is not a whole number in [1, 65536]" "" \
  "$BERTH" plan "$TINY_TOML" --gpus 0
# Beyond the layout search, and 2^32 + 1 (taken before).
expect_error "plan_gpus_beyond_the_search" "--gpus: 4294967297 is not a whole number in [1, 65536]" \
  "" "$BERTH" plan "$TINY_TOML" --gpus 4294967297
# --calibrate measures the machine: a config (or any plan option) was silently ignored.
expect_error "plan_calibrate_with_a_config" "takes no config (it plans nothing)" "$tmp/never.json" \
  "$BERTH" plan --calibrate "$TINY_TOML" --out "$tmp/never.json"
expect_error "plan_calibrate_with_gpus" "takes no --gpus" "$tmp/never.json" \
  "$BERTH" plan --calibrate --gpus 2 --out "$tmp/never.json"
expect_error "plan_out_without_calibrate" "--out is where --calibrate saves the profile" "" \
  "$BERTH" plan "$TINY_TOML" --out "$tmp/p.json"
expect_error "plan_negative_price" "--price-per-gpu-hour: -1 is not a number in [0, 1000000000]" "" \
  "$BERTH" plan "$TINY_TOML" --price-per-gpu-hour -1
# What berth train refuses in the data settings and files: a plan that "fits" (exit 0) misled.
expect_error "plan_dataset_vocab_above_model_vocab" "berth train refuses this config: data.train '$tmp/d.h5' has vocab_size 257 but model.vocab_size is 100: raise model.vocab_size to at least 257" "" \
  "$BERTH" plan "$TINY_TOML" "${TINY_SETS[@]}" --set "data.train=$tmp/d.h5" --set model.vocab_size=100
expect_error "plan_eval_without_val" "eval.interval is 5 but data.val is not set" "" \
  "$BERTH" plan "$TINY_TOML" --set eval.interval=5 --set data.val=
# --set takes one value: `--set k=v CONFIG` took the config as a second override.
"$BERTH" plan --set parallel.zero=0 "$TINY_TOML" >"$log" 2>&1
report "plan_set_before_the_config" "$(grep -q "^fits" "$log" || echo " $(tail -1 "$log")")"
"$BERTH" plan "$TINY_TOML" --gpus 2 --gpu h100 --price-per-gpu-hour 3 >"$log" 2>&1
why=""
grep -q "^parameters: 842624 " "$log" || why+=" no parameter count"
grep -q "^fits" "$log" || why+=" not 'fits'"
grep -q "smallest device count with a layout that fits: 1" "$log" || why+=" no smallest count"
report "plan_tiny_on_two_h100" "$why"
"$BERTH" plan "$TINY_TOML" --gpus 2 --json >"$log" 2>&1
report "plan_json_parses" "$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
assert d['params']['total'] == 842624 and d['layouts']" "$log" 2>&1 | tail -1)"

# ---- ledger and packing ---------------------------------------------------------------------------
# A mistyped ledger path is an error for the commands that only read it (not a new, empty ledger
# that answers "no reservations").
expect_error "reservations_on_a_missing_ledger" "does not exist" "$tmp/typo/ledger.db" \
  "$BERTH" reservations --ledger "$tmp/typo/ledger.db"
expect_error "timeline_on_a_missing_ledger" "does not exist" "$tmp/typo/ledger.db" \
  "$BERTH" timeline --ledger "$tmp/typo/ledger.db"
# Booking too: only `berth devices register` starts a ledger (the typo's directory is not made).
expect_error "reserve_on_a_missing_ledger" "start one with \`berth devices register\`" "$tmp/typo" \
  "$BERTH" reserve --gpus 1 --duration 1h --ledger "$tmp/typo/ledger.db"
# Registering starts a ledger, but not in a directory a typo named (it was created).
expect_error "register_into_a_missing_directory" "cannot write --ledger '$tmp/typo/ledger.db': the directory '$tmp/typo' does not exist" \
  "$tmp/typo" "$BERTH" devices register --cpu-slots 2 --ledger "$tmp/typo/ledger.db"
BERTH_LEDGER="$tmp/typo/ledger.db" expect_error "register_env_into_a_missing_directory" \
  "cannot write \$BERTH_LEDGER '$tmp/typo/ledger.db'" "$tmp/typo" \
  "$BERTH" devices register --cpu-slots 2
# An empty file (touch, a failed copy) is not taken for an empty ledger, and stays empty.
: > "$tmp/empty.db"
expect_error "reservations_on_an_empty_file" "is an empty file, not a ledger" "" \
  "$BERTH" reservations --ledger "$tmp/empty.db"
report "empty_ledger_file_untouched" "$([ -s "$tmp/empty.db" ] && echo " the empty file was written")"
expect_error "reserve_json_and_print_id" "--print-id excludes --json" "$tmp/l.db" \
  "$BERTH" reserve --gpus 1 --duration 1h --json --print-id --ledger "$tmp/l.db"
# A run that needs more than the year one request covers: the config and its time are named,
# not a --duration the user never gave ("--duration 694d10h is longer than a year").
"$BERTH" devices register --cpu-slots 1 --ledger "$tmp/year.db" >/dev/null 2>&1
expect_error "reserve_config_longer_than_a_year" "more than the year one booking request may cover" \
  "" "$BERTH" reserve --config "$TINY_TOML" --gpu cpu --set train.steps=100000000 --margin 10 \
  --ledger "$tmp/year.db"
report "reserve_config_year_names_no_duration_flag" \
  "$(grep -q -- '--duration' "$log" && echo ' names --duration')"
# --allow-split --print-id: every segment's id, one a line (3 for 15 days), not the first alone.
"$BERTH" reserve --gpus 1 --duration 15d --allow-split --print-id --ledger "$tmp/year.db" \
  >"$log" 2>&1
report "reserve_split_print_id_prints_every_segment" \
  "$([ "$(cat "$log")" = "$(printf '1\n2\n3')" ] || echo ' not the ids 1, 2, 3 a line each')"
# Outputs into a directory that does not exist are refused before the inputs are read, naming it.
expect_error "import_into_missing_directory" "the directory '$tmp/nodir' does not exist" \
  "$tmp/nodir" "$BERTH" data import --format text "$tmp/doc1.txt" --out "$tmp/nodir/d.h5"
expect_error "import_val_into_missing_directory" "cannot write --val-out '$tmp/nodir/v.h5'" \
  "$tmp/nodir" "$BERTH" data import --format text "$tmp/doc1.txt" "$tmp/doc2.txt" \
  --out "$tmp/d_ok.h5" --val-out "$tmp/nodir/v.h5" --val-fraction 0.5
report "import_refused_pair_left_nothing" "$([ -e "$tmp/d_ok.h5" ] && echo " wrote --out")"
expect_error "import_out_is_a_directory" "is a directory; give a file name, e.g. $tmp/runs/train.h5" "" \
  "$BERTH" data import --format text "$tmp/doc1.txt" --out "$tmp/runs"
# An --out that is not a token dataset (notes, a checkpoint's model.h5) was replaced.
echo "my notes" >"$tmp/notes.md"
expect_error "import_over_a_foreign_file" "refusing to replace --out '$tmp/notes.md': it is not an HDF5 file" \
  "" "$BERTH" data import --format text "$tmp/doc1.txt" --out "$tmp/notes.md"
report "import_foreign_file_kept" "$(grep -q '^my notes$' "$tmp/notes.md" || echo " the notes were replaced")"
expect_error "pack_into_missing_directory" "the directory '$tmp/nodir' does not exist" \
  "$tmp/nodir" "$BERTH" pack --data "$tmp/d.h5" --seq-len 16 --out "$tmp/nodir/p.h5"
# A failed check says what to do; its source line is shown only with BERTH_DEBUG=1.
"$BERTH" data import --format text "$tmp/doc1.txt" --out "$tmp/d1.h5" --val-out "$tmp/v1.h5" \
  --val-fraction 0.5 >"$log" 2>&1
report "check_location_hidden_by_default" "$(grep -q 'needs at least 2 documents' "$log" || \
  echo " no error"; grep -q 'failed at' "$log" && echo " shows it")"
BERTH_DEBUG=1 "$BERTH" data import --format text "$tmp/doc1.txt" --out "$tmp/d1.h5" \
  --val-out "$tmp/v1.h5" --val-fraction 0.5 >"$log" 2>&1
report "check_location_with_berth_debug" \
  "$(grep -q 'check `all.n_docs() >= 2` failed at .*cmd_data.cpp:[0-9]' "$log" || echo " missing")"
# A failure raised without a condition (BERTH_FAIL: every config check) names its line too.
BERTH_DEBUG=1 "$BERTH" train "$TINY_TOML" "${TINY_SETS[@]}" --set run.name=fail_where \
  --set train.steps=0 >"$log" 2>&1
report "fail_location_with_berth_debug" "$(grep -q 'train.steps must be > 0.*\[raised at .*config.cpp:[0-9]' "$log" || echo " missing")"
# Every document is longer than the rows and --drop-long drops them: no empty plan.
expect_error "pack_drops_every_document" "nothing to pack" "$tmp/p_empty.h5" \
  "$BERTH" pack --data "$tmp/d.h5" --seq-len 4 --drop-long --out "$tmp/p_empty.h5"
# The summary names every option the plan was made with (--align was left out).
"$BERTH" pack --data "$tmp/d.h5" --seq-len 16 --align 4 --out "$tmp/p_align.h5" >"$log" 2>&1
report "pack_summary_names_the_alignment" \
  "$(grep -q 'bfd split-long, seq_len 16, align 4)' "$log" || echo " missing")"
# A seed beyond 64 bits was saturated to 2^63 - 1 (another plan than asked for); a row length
# beyond model.max_seq_len's bound made a plan no run can use.
expect_error "pack_seed_beyond_64_bits" "--seed: 18446744073709551616 is not a whole number of 64 bits" \
  "$tmp/p_seed.h5" "$BERTH" pack --data "$tmp/d.h5" --seq-len 16 --seed 18446744073709551616 --out "$tmp/p_seed.h5"
expect_error "pack_seq_len_beyond_the_model_bound" "--seq-len: 4294967312 is not a whole number in [1, 16777215]" \
  "$tmp/p_long.h5" "$BERTH" pack --data "$tmp/d.h5" --seq-len 4294967312 --out "$tmp/p_long.h5"
expect_error "data_info_seq_len_beyond_the_model_bound" "--seq-len: 16777216 is not a whole number in [1, 16777215]" \
  "" "$BERTH" data info "$tmp/d.h5" --seq-len 16777216

# ---- outputs that would replace an input; numbers, units and names the checks let through ------
cp "$tmp/d.h5" "$tmp/self.h5"
expect_error "import_out_is_its_input" "names the input" "" \
  "$BERTH" data import --format llmc "$tmp/self.h5" --out "$tmp/self.h5"
report "import_input_kept" "$(cmp -s "$tmp/d.h5" "$tmp/self.h5" || echo " the input was replaced")"
expect_error "import_out_empty" "--out is empty: give a file name" "" \
  "$BERTH" data import --format text "$tmp/doc1.txt" --out ""
ck=$(ls -d "$tmp"/runs/tiny3/checkpoints/step-* | tail -1)
cp "$ck/model.h5" "$tmp/model_before.h5"
expect_error "export_into_the_checkpoint" "is inside the checkpoint" "" \
  "$BERTH" model export --format llmc "$ck/" --out "$ck/model.h5"
report "export_checkpoint_kept" "$(cmp -s "$ck/model.h5" "$tmp/model_before.h5" || echo " model.h5 replaced")"
"$BERTH" model export --format llmc "$ck" --out "$tmp/m.bin" >"$log" 2>&1
# An export replaces an earlier export, never another file (it replaced a token dataset).
"$BERTH" model export --format llmc "$ck" --out "$tmp/m.bin" >"$log" 2>&1
rc=$?
report "export_replaces_an_earlier_export" "$([ $rc -eq 0 ] || echo " refused (rc $rc)")"
cp "$tmp/d.h5" "$tmp/data_copy.h5"
expect_error "export_over_another_file" "exists and is not an llm.c model file" "" \
  "$BERTH" model export --format llmc "$ck" --out "$tmp/data_copy.h5"
report "export_other_file_kept" "$(cmp -s "$tmp/d.h5" "$tmp/data_copy.h5" || echo " the dataset was replaced")"
# Directory outputs written with a trailing '/': the export's temporary went inside the directory
# to be made, and the import looked for the directory it was to create.
"$BERTH" model export --format hf-gpt2 "$ck" --out "$tmp/hf_out/" >"$log" 2>&1 &&
  "$BERTH" model import --format hf-gpt2 "$tmp/hf_out" --out "$tmp/ck_from_hf/" >>"$log" 2>&1
rc=$?
report "model_outputs_with_a_trailing_slash" \
  "$([ $rc -eq 0 ] && [ -f "$tmp/hf_out/model.safetensors" ] && [ -d "$tmp/ck_from_hf" ] || echo " refused (rc $rc)")"
expect_error "model_import_into_missing_directory" "the directory '$tmp/nodir2' does not exist" \
  "$tmp/nodir2" "$BERTH" model import --format llmc "$tmp/m.bin" --out "$tmp/nodir2/ck"
expect_error "timeline_html_is_a_directory" "give a file name, e.g. $tmp/runs/timeline.html" "" \
  "$BERTH" timeline --html "$tmp/runs" --ledger "$tmp/l.db"
expect_error "timeline_html_empty" "--html is empty: give a file name" "" \
  "$BERTH" timeline --html "" --ledger "$tmp/l.db"
"$BERTH" devices register --cpu-slots 2 --ledger "$tmp/led.db" >/dev/null 2>&1
# The page replaces only an earlier page: --html naming the ledger replaced every booking, and a
# FIFO or device node was replaced by a file.
cp "$tmp/led.db" "$tmp/led_copy.db"
expect_error "timeline_html_over_the_ledger" "is not a berth timeline page" "" \
  "$BERTH" timeline --html "$tmp/led_copy.db" --ledger "$tmp/led_copy.db"
report "timeline_html_ledger_kept" "$(cmp -s "$tmp/led.db" "$tmp/led_copy.db" || echo " the ledger was replaced")"
mkfifo "$tmp/fifo"
expect_error "timeline_html_over_a_fifo" "exists and is not a regular file" "" \
  "$BERTH" timeline --html "$tmp/fifo" --ledger "$tmp/led.db"
report "timeline_html_fifo_kept" "$([ -p "$tmp/fifo" ] || echo " the FIFO was replaced")"
"$BERTH" timeline --html "$tmp/page.html" --ledger "$tmp/led.db" >"$log" 2>&1 &&
  "$BERTH" timeline --html "$tmp/page.html" --ledger "$tmp/led.db" >"$log" 2>&1
report "timeline_html_replaces_its_own_page" "$([ $? -eq 0 ] || echo " refused")"
# An empty --ledger (an unset variable) fell back to $BERTH_LEDGER or the default ledger.
expect_error "ledger_option_empty" "--ledger: empty: give a ledger file" "" \
  "$BERTH" reservations --ledger ""
expect_error "reserve_gpu_without_config" "reserve --gpu sizes the booking from a config's plan" "" \
  "$BERTH" reserve --gpus 1 --duration 1h --gpu h100 --ledger "$tmp/led.db"
expect_error "reserve_margin_without_config" "reserve --margin sizes the booking" "" \
  "$BERTH" reserve --gpus 1 --duration 1h --margin 2 --ledger "$tmp/led.db"
expect_error "reserve_a_microsecond" "--duration must be at least 1s" "" \
  "$BERTH" reserve --gpus 1 --duration 1e-7s --print-id --ledger "$tmp/led.db"
expect_error "reserve_empty_idempotency_key" "--idempotency-key: empty: give a key" "" \
  "$BERTH" reserve --gpus 1 --duration 1h --idempotency-key "" --ledger "$tmp/led.db"
mkdir "$tmp/led.db.policy.toml"
expect_error "ledger_policy_is_a_directory" "the ledger's policy $tmp/led.db.policy.toml is not a file" \
  "" "$BERTH" reserve --gpus 1 --duration 1h --ledger "$tmp/led.db"
rmdir "$tmp/led.db.policy.toml"
# A device file as the ledger: SQLite wrote a journal beside it (/dev/null-journal) and the error
# blamed the disk. Refused before anything is opened.
mkfifo "$tmp/pipe.db"
expect_error "ledger_is_a_pipe" "ledger '$tmp/pipe.db' is not a regular file (a pipe, socket" "" \
  "$BERTH" reservations --ledger "$tmp/pipe.db"
report "ledger_is_a_pipe_no_journal" "$(ls "$tmp"/pipe.db-* 2>/dev/null | sed 's/^/ left /')"
# A register that fails on its device list starts no ledger file (a later command took the empty
# ledger for one with no bookings).
printf '[[hosts]]\nname = "a"\nmodel = "H\\u202e100"\nmemory_gib = 80\ngpus = 1\n' >"$tmp/nomodel.toml"
expect_error "register_bad_device_makes_no_ledger" "its model must be 1..64 characters" \
  "$tmp/fresh.db" "$BERTH" devices register --from "$tmp/nomodel.toml" --ledger "$tmp/fresh.db"
# --resume "" (an unset variable) trained from step 0 without a word.
expect_error "train_resume_empty" "--resume: empty: give a step-N checkpoint directory" \
  "$tmp/runs/resume_empty" train_tiny resume_empty --resume ""
expect_error "train_steps_beyond_the_predictor" "more than 100000000" "$tmp/runs/huge" \
  train_tiny huge --set train.steps=1000000000
expect_error "timeline_hours_nan" "--hours: nan is not a number in [1, 8784]" "" \
  "$BERTH" timeline --hours nan --ledger "$tmp/l.db"
expect_error "reserve_margin_nan" "--margin: nan is not a number in [1, 10]" "" \
  "$BERTH" reserve --config "$TINY_TOML" --gpu cpu --margin nan --ledger "$tmp/l.db"
expect_error "reserve_memory_without_unit" "the size '80' has no unit: say 80GiB or 80GB" "" \
  "$BERTH" reserve --gpus 1 --duration 1h --min-free-mem 80 --ledger "$tmp/l.db"
# Hexadecimal, inf and a '+' passed stod/stoll or CLI11's own conversion (0x2 devices, 0x10h).
expect_error "reserve_gpus_in_hex" "--gpus: 0x2 is not a whole number" "" \
  "$BERTH" reserve --gpus 0x2 --duration 1h --ledger "$tmp/l.db"
expect_error "reserve_duration_in_hex" "unknown unit 'x' in the duration '0x10h'" "" \
  "$BERTH" reserve --gpus 1 --duration 0x10h --ledger "$tmp/l.db"
expect_error "register_slots_in_hex" "--cpu-slots: 0x4 is not a whole number in [1, 4096]" \
  "$tmp/hex.db" "$BERTH" devices register --cpu-slots 0x4 --ledger "$tmp/hex.db"
expect_error "timeline_hours_in_hex" "--hours: 0x20 is not a number in [1, 8784]" "" \
  "$BERTH" timeline --hours 0x20 --ledger "$tmp/l.db"
expect_error "reserve_gpus_leading_zero" "--gpus: 010 is not a whole number" "" \
  "$BERTH" reserve --gpus 010 --duration 1h --ledger "$tmp/l.db"
expect_error "eta_every_plus_sign" "--every: +5 is not a whole number >= 0" "" \
  "$BERTH" eta replay "$TINY_TOML" --meta "$TINY_TOML" --every +5
# A file's bytes quoted in an error are shown, not sent to the terminal: an escape sequence in a
# trace's header (binary junk, a colour code) printed raw.
printf 'st\001ep,\033[31mduration_s\n1,2\n' >"$tmp/junk.csv"
expect_error "eta_replay_control_bytes_shown" "header is 'st\x01ep,\x1b[31mduration_s'" "" \
  "$BERTH" eta replay "$tmp/junk.csv" --meta "$TINY_TOML"
report "eta_replay_control_bytes_not_printed" "$(grep -q $'\033' "$log" && echo " a raw ESC byte in the output")"
# A missing trace, facts file or directory is a usage error (105), as for every other command.
"$BERTH" eta replay "$tmp/none.csv" --meta "$TINY_TOML" >"$log" 2>&1
rc=$?
"$BERTH" eta bench "$tmp/no_such_dir" >>"$log" 2>&1
rc2=$?
report "eta_missing_inputs_exit_105" "$([ $rc -eq 105 ] && [ $rc2 -eq 105 ] || echo " exit status $rc, $rc2")"
expect_error "cancel_empty_id" "is not a whole number >= 1" "" "$BERTH" cancel "" --ledger "$tmp/l.db"
expect_error "cancel_id_beyond_int64" "99999999999999999999 is beyond the whole numbers of 64 bits (at most 9223372036854775807)" "" \
  "$BERTH" cancel 99999999999999999999 --ledger "$tmp/l.db"
printf '[[hosts]]\nname = "n1"\nmodel = "A100"\nmemory_gib = 40\ngpus = 4\n[[hosts]]\nname = "n1"\nmodel = "H100"\nmemory_gib = 80\ngpus = 8\n' >"$tmp/dup.toml"
expect_error "inventory_host_twice" "host 'n1' is listed already (entry 1)" "$tmp/inv.db" \
  "$BERTH" devices register --from "$tmp/dup.toml" --ledger "$tmp/inv.db"
printf '[[hosts]]\nname = "n1:0"\nmodel = "A100"\nmemory_gib = 1e300\ngpus = 4\n' >"$tmp/badhost.toml"
expect_error "inventory_host_name" "host name 'n1:0' must be 1..253 letters" "$tmp/inv.db" \
  "$BERTH" devices register --from "$tmp/badhost.toml" --ledger "$tmp/inv.db"
# eta replay: a run too long to forecast step by step is refused at once (it took minutes);
# steps of 0 s give 0, not NaN; a number beyond a double is invalid JSON, not an internal error.
printf 'step,duration_s,tokens,seq_len,compute_s,comm_s,data_wait_s,overhead_s,mem_gib,event\n' >"$tmp/z.csv"
for i in $(seq 20); do echo "$i,0,64,16,0,0,0,0,0.1," >>"$tmp/z.csv"; done
facts='"start_step": 0, "session_steps": 100, "ckpt_interval": 0, "eval_interval": 0, "schedule": [[0, 16, 64]], "hidden_size": 32, "mem_capacity_gib": 1, "lease_s": 0'
echo "{\"max_steps\": 100, $facts}" >"$tmp/z.json"
"$BERTH" eta replay "$tmp/z.csv" --meta "$tmp/z.json" >"$log" 2>&1
report "eta_replay_zero_durations" "$(grep -q 'high_s=0.000$' "$log" || echo " not 0"; grep -qi nan "$log" && echo " NaN")"
echo "{\"max_steps\": 1000000000000000000, $facts}" >"$tmp/big.json"
expect_error "eta_replay_steps_beyond_the_predictor" "max_steps 1000000000000000000 is beyond the 100000000 steps" "" \
  timeout 20 "$BERTH" eta replay "$tmp/z.csv" --meta "$tmp/big.json"
echo "{\"max_steps\": 100, $facts, \"x\": 1e400}" >"$tmp/ovf.json"
mkdir -p "$tmp/bench" && cp "$tmp/z.csv" "$tmp/bench/z.csv"
echo "[{\"file\": \"z.csv\", \"true_total_s\": 0, \"max_steps\": 20, ${facts/\"session_steps\": 100/\"session_steps\": 20}}]" >"$tmp/bench/index.json"
expect_error "eta_bench_truth_not_positive" "entry 0 (\"z.csv\"): true_total_s must be > 0, got 0" "" \
  "$BERTH" eta bench "$tmp/bench"
# A session_steps that is not the trace's length named the entry's number, not its file.
echo "[{\"file\": \"z.csv\", \"true_total_s\": 50, \"max_steps\": 20, ${facts/\"session_steps\": 100/\"session_steps\": 1}}]" >"$tmp/bench/index.json"
expect_error "eta_bench_session_not_the_trace" "entry 0 (\"z.csv\"): trace has 20 rows, session_steps is 1" "" \
  "$BERTH" eta bench "$tmp/bench"
expect_error "eta_replay_number_overflow" "invalid JSON" "" "$BERTH" eta replay "$tmp/z.csv" --meta "$tmp/ovf.json"
# Directories read as nothing: "empty trace", "invalid JSON".
expect_error "eta_replay_trace_is_a_directory" "trace: File is actually a directory: $tmp" "" \
  "$BERTH" eta replay "$tmp" --meta "$tmp/z.json"
expect_error "eta_replay_meta_is_a_directory" "--meta: File is actually a directory: $tmp" "" \
  "$BERTH" eta replay "$tmp/z.csv" --meta "$tmp"
# A denormal time (1e-320) is a number (it was "not a number"); a trace of another session (facts
# starting at step 50) names the row and the facts file, not only the step.
sed '2s/^1,0,/1,1e-320,/' "$tmp/z.csv" >"$tmp/denormal.csv"
"$BERTH" eta replay "$tmp/denormal.csv" --meta "$tmp/z.json" >"$log" 2>&1
rc=$?
report "eta_replay_denormal_time" "$([ $rc -eq 0 ] || echo " refused (rc $rc)"
  grep -q '^1,1e-320,' "$tmp/denormal.csv" || echo " the trace has no denormal"
  grep -Eq '^predicted_total_s=[0-9.e+-]+ predicted_remaining_s=[0-9.e+-]+ low_s=[0-9.e+-]+ high_s=[0-9.e+-]+$' "$log" ||
    echo " no prediction line of finite numbers"
  grep -qi nan "$log" && echo " NaN")"
echo "{\"max_steps\": 200, ${facts/\"start_step\": 0/\"start_step\": 50}}" >"$tmp/later.json"
expect_error "eta_replay_other_session" "z.csv begins at step 1, but the session $tmp/later.json describes begins at global step 51" "" \
  "$BERTH" eta replay "$tmp/z.csv" --meta "$tmp/later.json"
# A resumed session's trace (steps 11..) against a fresh run's facts predicted 0.02 s.
echo "{\"max_steps\": 200, ${facts}}" >"$tmp/fresh.json"
sed '2,11d' "$tmp/z.csv" >"$tmp/z_resumed.csv"
expect_error "eta_replay_resumed_trace_fresh_facts" "z_resumed.csv begins at step 11, but the session" "" \
  "$BERTH" eta replay "$tmp/z_resumed.csv" --meta "$tmp/fresh.json"
# An index whose true total is below the trace's own time printed negative errors.
mkdir -p "$tmp/bench_half"
cp "$tmp/z.csv" "$tmp/bench_half/t.csv"
sed -i 's/^\([0-9]*\),0,/\1,2,/' "$tmp/bench_half/t.csv"
echo "[{\"file\": \"t.csv\", \"true_total_s\": 20, \"max_steps\": 200, ${facts/\"session_steps\": 100/\"session_steps\": 20}}]" \
  >"$tmp/bench_half/index.json"
expect_error "eta_bench_truth_below_the_trace" "true_total_s 20.000 is less than the 40.000 s the steps of t.csv took" "" \
  "$BERTH" eta bench "$tmp/bench_half"

# srun without MPI wire-up starts each task as a world of 1: refused, not one task training alone.
expect_error "srun_tasks_not_wired_up" "srun started 2 tasks (SLURM_STEP_NUM_TASKS) but MPI sees this one (SLURM_PROCID 1) alone" \
  "$tmp/runs/srun_alone" env SLURM_STEP_NUM_TASKS=2 SLURM_PROCID=1 "$BERTH" train "$TINY_TOML" \
  "${TINY_SETS[@]}" --set "data.train=$tmp/d.h5" --set run.name=srun_alone
# A batch script's shell (no srun step) and `srun -n 1` run as they are.
SLURM_NTASKS=2 SLURM_STEP_NUM_TASKS=1 train_tiny srun_one >"$log" 2>&1
rc=$?
report "srun_one_task_trains" "$([ $rc -eq 0 ] || echo " exit $rc for one srun task")"

# Thousands of files on one command line (over 128 KiB of arguments): Open MPI's singleton
# start-up failed on them ("Argument list too long") before berth said anything; data commands
# run without MPI.
mkdir -p "$tmp/many"
for i in $(seq 9000); do echo "document $i" >"$tmp/many/a_file_with_a_long_name_$i.txt"; done
"$BERTH" data import --format text "$tmp"/many/a_file_with_a_long_name_*.txt --out "$tmp/many.h5" \
  >"$log" 2>&1
rc=$?
report "data_import_9000_files" "$([ $rc -eq 0 ] && grep -q "9000 documents" "$log" || echo " rc $rc")"
# More files than any command line takes (ARG_MAX): a list of them, from a file or standard input.
find "$tmp/many" -name '*.txt' | "$BERTH" data import --format text --files-from - \
  --out "$tmp/many_listed.h5" >"$log" 2>&1
rc=$?
report "data_import_files_from_stdin" "$([ $rc -eq 0 ] && grep -q "9000 documents" "$log" || echo " rc $rc")"
printf '%s\n' "$tmp/many/a_file_with_a_long_name_1.txt" "" "$tmp/many/missing.txt" >"$tmp/list.txt"
expect_error "data_import_files_from_names_the_missing_line" \
  "--files-from '$tmp/list.txt' line 3: '$tmp/many/missing.txt' does not exist" "$tmp/listed.h5" \
  "$BERTH" data import --format text --files-from "$tmp/list.txt" --out "$tmp/listed.h5"
expect_error "data_import_without_inputs" "needs its inputs: files on the command line, or --files-from" \
  "$tmp/none.h5" "$BERTH" data import --format text --out "$tmp/none.h5"
rm -rf "$tmp/many" "$tmp/many.h5"

# ---- summary -------------------------------------------------------------------------------------

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
