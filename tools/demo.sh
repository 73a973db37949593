#!/usr/bin/env bash
# The main job, end to end: install, build, train a tiny byte-level LM on 4 MPI ranks with
# ZeRO-2, save, resume, inspect and deep-check, show what corruption looks like, export to
# safetensors, convert to the universal layout, reshard 4 -> 2 ranks and resume there, then
# verify the next update and resume parity; then a topology-invariant run trained on 4 ranks and
# resumed on 3, bitwise; then a PyTorch run (2 ranks, DDP + ZeroRedundancyOptimizer, saved
# through the ckpt Python package); last, whether compression pays on this disk (ckpt probe).
# Ends with a summary table.
#
# CKPT_DEMO_DIR (default /tmp/ckpt-demo) holds everything it writes; it is recreated.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$CKPT_ROOT"

ckpt_install_packages
ckpt_build build ckpt_cli engine_min ckpt_h5zstd ckpt_python

DEMO="${CKPT_DEMO_DIR:-/tmp/ckpt-demo}"
BIN="$CKPT_ROOT/build/bin"
CKPT="$BIN/ckpt"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
rm -rf "$DEMO"
mkdir -p "$DEMO"
declare -a SUMMARY=()
note() { SUMMARY+=("$(printf '%-34s %s' "$1" "$2")"); }
show_losses() {  # show_losses LOG FROM_STEP TO_STEP
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
log, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for line in open(log):
    r = json.loads(line)
    if lo <= r["step"] <= hi:
        print("    step %4d  loss %.4f  grad_norm %.4f  lr %.2e" % (r["step"], r["loss"], r["grad_norm"], r["lr"]))
PY
}
last_loss() { /usr/bin/python3 -c "import json,sys; print('%.4f' % json.loads(open(sys.argv[1]).readlines()[-1])['loss'])" "$1"; }
first_loss() { /usr/bin/python3 -c "import json,sys; print('%.4f' % json.loads(open(sys.argv[1]).readline())['loss'])" "$1"; }

RUN="$DEMO/run"
TRAIN=(--model tiny --zero 2 --micro-batch 4 --grad-accum 2 --lr 3e-3 --warmup 10 --seed 7
       --save-every 20 --keep-last 3 --compress zstd:1+shuffle)

ckpt_log "1. train the tiny model on 4 ranks, ZeRO-2, 60 steps (checkpoints every 20)"
"${MPIRUN[@]}" -n 4 "$BIN/engine_min" train "${TRAIN[@]}" --steps 60 --ckpt-dir "$RUN" \
  --client-state run=demo --client-state owner=ckpt
show_losses "$RUN/trainlog.jsonl" 1 3
echo "    ..."
show_losses "$RUN/trainlog.jsonl" 58 60
note "train 4 ranks ZeRO-2, 60 steps" "loss $(first_loss "$RUN/trainlog.jsonl") -> $(last_loss "$RUN/trainlog.jsonl")"

ckpt_log "2. resume from latest in fresh processes and continue to step 100"
"${MPIRUN[@]}" -n 4 "$BIN/engine_min" train --resume --ckpt-dir "$RUN" --steps 100
show_losses "$RUN/trainlog.jsonl" 61 63
echo "    ..."
show_losses "$RUN/trainlog.jsonl" 98 100
note "resume 60 -> 100" "loss $(last_loss "$RUN/trainlog.jsonl") at step 100"

ckpt_log "3. list, inspect and deep-check"
"$CKPT" ls "$RUN"
"$CKPT" inspect "$RUN" | head -14
"$CKPT" check "$RUN" --deep
note "ckpt check --deep (latest)" "ok"

ckpt_log "4. what corruption looks like: one flipped byte in a copy of rank 2's file"
BAD="$DEMO/corrupted"
mkdir -p "$BAD"
TAG=$(head -n 1 "$RUN/latest")  # line 1 of latest is the tag (docs/format.md)
cp -r "$RUN/$TAG" "$BAD/"
echo "$TAG" > "$BAD/latest"
/usr/bin/python3 - "$BAD/$TAG/rank_00002.h5" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) // 2] ^= 0x40
open(p, "wb").write(b)
PY
set +e
"$CKPT" check "$BAD" --deep
rc=$?
set -e
echo "    exit code $rc (1 = corruption found, named above)"
[ "$rc" -eq 1 ] || { echo "expected exit 1 from a corrupted checkpoint" >&2; exit 1; }
note "corrupted copy: ckpt check --deep" "exit 1, names rank_00002.h5"

ckpt_log "5. export fp32 weights to safetensors (reads master weights only)"
"$CKPT" export-fp32 "$RUN" "$DEMO/export"
ls -l "$DEMO/export"
# The export carries its own checksums (__metadata__ ckpt_tensor_xxh3 / ckpt_header_xxh3).
"$CKPT" check --deep "$DEMO/export"
note "export-fp32" "$(ls "$DEMO/export" | tr '\n' ' ')(ckpt check --deep: ok)"

ckpt_log "6. universal layout, then reshard 4 -> 2 ranks"
"$CKPT" to-universal "$RUN" "$DEMO/universal"
"$CKPT" reshard "$DEMO/universal" "$DEMO/run2" --dp 2
"$CKPT" inspect "$DEMO/run2" | head -5
note "to-universal + reshard 4 -> 2" "ok"

ckpt_log "7. resume on 2 ranks (grad-accum 4 keeps the global batch of 32) to step 110"
"${MPIRUN[@]}" -n 2 "$BIN/engine_min" train --resume --ckpt-dir "$DEMO/run2" --grad-accum 4 \
  --steps 110 --trainlog "$DEMO/run2/trainlog.jsonl"
show_losses "$DEMO/run2/trainlog.jsonl" 101 103
note "resume on 2 ranks, 100 -> 110" "loss $(first_loss "$DEMO/run2/trainlog.jsonl") -> $(last_loss "$DEMO/run2/trainlog.jsonl")"

# Verification needs the original run to have continued past the checkpoint: global_step80
# (kept by --keep-last 3) is followed by 20 logged steps.
VTAG=global_step80
ckpt_log "8. next AdamW update from $VTAG: full state vs weights-only vs moments dropped"
"$CKPT" next-update "$RUN" --tag "$VTAG" --out "$DEMO/next-update"
ckpt_log "9. resume parity and ablations (3 steps from $VTAG)"
set +e
"$CKPT" verify-resume "$RUN" --tag "$VTAG" --steps 3 --ablate all
rc=$?
set -e
note "verify-resume (plain)" "$([ $rc -eq 0 ] && echo bitwise || echo "DIVERGED (exit $rc)")"
ckpt_log "10. the CI gate: ckpt verify"
set +e
"$CKPT" verify "$RUN" --tag "$VTAG" --junit "$DEMO/verify-junit.xml"
vrc=$?
set -e
note "ckpt verify (CI gate)" "exit $vrc, JUnit in $DEMO/verify-junit.xml"

ckpt_log "11. topology-invariant mode: train on 4 ranks, resume on 3 (to-universal + reshard), bitwise"
INV="$DEMO/invariant"
"${MPIRUN[@]}" -n 4 "$BIN/engine_min" train --invariant --model tiny --zero 2 --global-batch 12 \
  --micro-batch 3 --lr 3e-3 --warmup 2 --seed 7 --steps 6 --save-every 3 --ckpt-dir "$INV"
set +e
"$CKPT" verify-resume "$INV" --tag global_step3 --steps 3 --dp 3
irc=$?
set -e
note "invariant: 4 ranks -> resume on 3" "$([ $irc -eq 0 ] && echo bitwise || echo "DIVERGED (exit $irc)")"
ckpt_log "12. PyTorch: 2 ranks, DDP + ZeroRedundancyOptimizer(AdamW), saved through ckpt.torch"
PT="$DEMO/torch"
tools/torchrun.sh 2 examples/torch/train.py --zero 1 --steps 8 --save-every 4 --ckpt-dir "$PT"
tools/torchrun.sh 2 examples/torch/train.py --resume --ckpt-dir "$PT" --steps 12
show_losses "$PT/trainlog.jsonl" 7 10
"$CKPT" ls "$PT"
"$CKPT" check "$PT" --deep
note "torch 2 ranks ZeRO-1, 8 + 4 steps" "loss $(first_loss "$PT/trainlog.jsonl") -> $(last_loss "$PT/trainlog.jsonl"), check --deep ok"
ckpt_log "13. PyTorch resume parity through the trainer: verify-resume --launch (4 steps from global_step4)"
set +e
"$CKPT" verify-resume "$PT" --tag global_step4 --steps 4 --launch \
  "tools/torchrun.sh {world} examples/torch/train.py --resume --ckpt-dir {root} --resume-tag {tag} --steps {until} --trainlog {trainlog}"
trc=$?
set -e
note "torch verify-resume --launch" "$([ $trc -eq 0 ] && echo bitwise || echo "DIVERGED (exit $trc)")"
ckpt_log "14. PyTorch export-fp32, loaded back with load_state_dict(strict=True)"
"$CKPT" export-fp32 "$PT" "$DEMO/torch-export"
PYTHONPATH="$CKPT_ROOT/build/python:$CKPT_ROOT/examples/torch" /usr/bin/python3 - "$PT" "$DEMO/torch-export" <<'PY'
import sys, torch, ckpt, ckpt.torch, train
cfg = ckpt.inspect(sys.argv[1])["client_state"]["train_config"]
model = train.TinyGPT(cfg["d_model"], cfg["layers"], cfg["heads"], cfg["context"], cfg["dropout"])
print("    load_state_dict(strict=True):", model.load_state_dict(ckpt.torch.load_export(sys.argv[2]), strict=True))
w = ckpt.Reader(sys.argv[1]).read_param("blocks.0.qkv.weight")
assert torch.equal(model.blocks[0].qkv.weight.detach(), torch.from_numpy(w)), "export differs"
PY
note "torch export-fp32 -> strict load" "ok"
ckpt_log "15. should checkpoints on this disk be compressed? ckpt probe (256 MiB saves, both ways)"
"$CKPT" probe "$DEMO" --size 256MiB --pairs 1 > "$DEMO/probe.txt"
tail -n 2 "$DEMO/probe.txt"
note "ckpt probe (this disk)" "$(sed -n 's/^here: //p' "$DEMO/probe.txt" | cut -d';' -f1)"

echo
ckpt_log "summary"
for line in "${SUMMARY[@]}"; do echo "  $line"; done
echo "  everything is under $DEMO"
[ "$rc" -eq 0 ] && [ "$vrc" -eq 0 ] && [ "$irc" -eq 0 ] && [ "$trc" -eq 0 ]
