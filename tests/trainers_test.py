#!/usr/bin/env python3
"""Trainers under test, end to end: `pipecheck run` over a suite of external-trainer rows, then
each row's status and the words its message must hold.

  --suite external: tests/data/external.csv, the worked external trainer (examples/plain_trainer.py)
    right, and wrong in each way the protocol names (a gradient bug, a missing step, a wrong shape,
    a NaN, an unknown name, no loss, a crash, a hang): the bug is caught with its parameter and
    step, a breach of the protocol is an ERROR saying which, never a PASS; and PyTorch's pipelining
    with one activation corrupted on purpose, named by the first-divergence judge.
  --suite torch: scenarios/torch-pipelining.csv, PyTorch's pipelining: the run exits 0 (every row
    met its expectation as resolved for the PyTorch built against) and every row expected to fail
    fails for the reason its note gives on that PyTorch.
  --suite torch-moe: scenarios/torch-moe.csv, PyTorch's pipelining training a mixture of experts with
    the balance loss attached on each stage: the same, and every expect=pass row with a balance
    loss shows its own parity (summary.csv's aux_loss_max_rel_err within the row's tolerance).
  --suite torchtitan: scenarios/torchtitan.csv, TorchTitan's own Trainer: the run exits 0, every
    expect=pass row passes with its weights judged every step, and every expect=fail row fails for
    the reason its note gives (a defect found, a combination TorchTitan refuses, the control caught
    naming parameter and step). Skipped (77) where TorchTitan is not installed.
  --suite deepspeed, --suite megatron: scenarios/deepspeed.csv, megatron.csv, the same way: DeepSpeed's
    pipeline engine and Megatron-Core's schedules, at least 6 expect=pass rows each, every
    expect=fail row failing for its reason (a defect found upstream, the framework's default loss
    under the other normalisation, the adapter's two faults caught naming parameter, stage and
    step). Skipped (77) where the framework is not installed (requirements-frameworks.txt).
"""
import argparse
import csv
import fnmatch
import importlib
import os
import subprocess
import sys
import tempfile

# scenario -> (status, words its message must hold)
EXTERNAL = {
    "plain_right": ("PASS", ["weights after each step match"]),
    "plain_right_clipped": ("PASS", ["weights after each step match"]),
    "plain_grad_bug": ("FAIL", ["gradient of layers.0.feed_forward.w2.weight at step 1", "rel err 0.5"]),
    "plain_missing_step": ("ERROR", ["broke the protocol", "rank 0 handed back no step_2.pt"]),
    "plain_bf16_master": ("PASS", ["weights after each step match"]),
    "plain_bf16_stale_copy": ("FAIL", ["weight norm.weight after step 1 on rank 0 (stage 0) is not its float32 master "
                                       "weight rounded to BFloat16"]),
    "plain_bf16_master_lr_bug": ("FAIL", ["update of the float32 master weight of norm.weight at step 1 on rank 0 "
                                          "(stage 0): rel err 1 > tol 0.0001"]),
    "plain_wrong_shape": ("ERROR", ["broke the protocol", "rank 0 step_0.pt grads", "layers.0.attention.wq.weight",
                                    "shape [64, 63], the model's is [64, 64]"]),
    "plain_nan": ("ERROR", ["broke the protocol", "rank 0 step_0.pt grads: norm.weight holds NaN"]),
    "plain_bad_name": ("ERROR", ["broke the protocol", "'model.norm.weight' is no parameter of the model"]),
    "plain_no_loss": ("ERROR", ["broke the protocol", "no rank handed back step 0's loss"]),
    "plain_crash": ("ERROR", ["rank 0 exited with code 1", "the crash this fault asks for"]),
    "plain_hang": ("TIMEOUT", ["rank(s) 0 still running after the", "deadline"]),
    "plain_unknown_fault": ("ERROR", ["unknown fault 'no_such_fault'"]),
    # PyTorch's trainer handing back its boundary tensors: the corrupted one is named first.
    "torch_corrupted_activation": ("FAIL", ["step 0, microbatch 1: activation into stage 1 (from rank 0) rel err 0.01"]),
}

# scenario -> {the first PyTorch (major, minor) a reason holds from: the words its message must hold}
TORCH_FAILURES = {
    "torch_1f1b_uneven_microbatches": {
        (2, 11): ["PipeliningShapeError", "expected torch.Size([3, 32]) actual torch.Size([2, 32])"],
        (2, 15): ["rank 1", "[Stage 1] failed to run forward", "torch.Size([3, 32, 64])"]},
    "torch_gpipe_uneven_microbatches": {
        (2, 11): ["PipeliningShapeError", "expected torch.Size([2, 32]) actual torch.Size([1, 32])"],
        (2, 15): ["rank 1", "Expected input batch_size (64) to match target batch_size (32)"]},
    "torch_zbh1_identity_stage": {
        (2, 11): ["rank 1", "element 0 of tensors does not require grad and does not have a grad_fn"]},
    "torch_zbv_identity_stage": {
        (2, 11): ["rank 1", "element 0 of tensors does not require grad and does not have a grad_fn"]},
    "torch_dualpipev_identity_stage": {
        (2, 11): ["rank 1", "element 0 of tensors does not require grad and does not have a grad_fn"]},
    # scenarios/torch-moe.csv (judged on 2.15 only: the oldest build runs trainers_torch_range).
    "torch_moe_zbh1_3ranks_identity_attach": {(2, 15): ["rank 1", "Stage output:",
                                                         "Can't detach views in-place"]},
    "torch_moe_zbv_identity_attach": {(2, 15): ["rank 1", "Stage output:",
                                                 "Can't detach views in-place"]},
    "torch_moe_dualpipev_identity_attach": {(2, 15): ["rank 1", "Can't detach views in-place"]},
    "torch_moe_1f1b_last_stage_only": {(2, 15): ("FAIL", ["on rank 0 (stage 0)",
                                                          "worst gradient layers.1.feed_forward.router.weight at step 0 "
                                                          "on rank 0 (stage 0)"])},
    "torch_moe_bias_1f1b_counts_kept": {(2, 15): ("FAIL", ["routing counts layers.0.feed_forward.expert_counts on "
                                                           "rank 0 (stage 0) at step 1"])},
    "torch_moe_recompute_zbh1": {(2, 15): ("FAIL", ["routing counts layers.2.feed_forward.expert_counts on rank 1 "
                                                     "(stage 1) at step 0"])},
    "torch_moe_recompute_zbv": {(2, 15): ("FAIL", ["routing counts layers.3.feed_forward.expert_counts on rank 0 "
                                                    "(stage 3) at step 0"])},
    "torch_moe_recompute_dualpipev": {(2, 15): ("FAIL", ["routing counts layers.3.feed_forward.expert_counts on rank 0 "
                                                          "(stage 3) at step 0"])},
    "torch_moe_recompute_1f1b_counts_unhalved": {(2, 15): ("FAIL", ["routing counts layers.0.feed_forward.expert_counts "
                                                                     "on rank 0 (stage 0) at step 0"])},
    "torch_zbv_gloo_init_as_shipped": {(2, 11): ["Pair is not connected"]},
    "torch_dualpipev_gloo_init_as_shipped": {(2, 11): ["Pair is not connected"]},
}


# scenario -> (status, words its message must hold): scenarios/torchtitan.csv's expect=fail rows.
TITAN_FAILURES = {
    "titan_zbh1": ("FAIL", ["gradient of norm.weight at step 0 is missing from every rank"]),
    "titan_zbv": ("FAIL", ["gradient of norm.weight at step 0 is missing from every rank"]),
    "titan_dualpipev": ("FAIL", ["gradient of norm.weight at step 0 on rank 0 (stage 3): rel err 0.5"]),
    "titan_zbv_recompute": ("ERROR", ["Trying to backward an extra time", "selective"]),
    "titan_1f1b_tied": ("ERROR", ["Weight tying is not supported with Pipeline Parallel"]),
    "titan_1f1b_empty_stage": ("ERROR", ["rank 1 exited", "matched no parameters"]),
    "titan_1f1b_clip_norm_without_pp_reduction": ("FAIL", ["gradient of tok_embeddings.weight at step 0 on rank 0 "
                                                           "(stage 0): rel err"]),
}


# scenarios/deepspeed.csv's expect=fail rows.
DEEPSPEED_FAILURES = {
    # deepspeedai/DeepSpeed#1839: the clip's norm leaves out every stage but the first.
    "ds_clip": ("FAIL", ["gradient of tok_embeddings.weight at step 0 on rank 0 (stage 0): rel err 0.318"]),
    "ds_clip_microbatch_mean": ("FAIL", ["gradient of tok_embeddings.weight at step 0 on rank 0 (stage 0): rel err"]),
    "ds_default_loss_under_tokens": ("FAIL", ["gradient of tok_embeddings.weight at step 0 on rank 0 (stage 0): rel err"]),
    "ds_fault_skip_tied_reduce": ("FAIL", ["gradient of tok_embeddings.weight at step 0 on rank 0 (stage 0): rel err"]),
    "ds_fault_accumulation_scaled_twice": ("FAIL", ["at step 0 on rank 0 (stage 0): rel err 0.75"]),
}

# scenarios/megatron.csv's expect=fail rows.
MEGATRON_FAILURES = {
    "mg_default_loss_under_tokens": ("FAIL", ["loss at step 0: pipeline", "worst gradient"]),
    "mg_fault_skip_tied_reduce": ("FAIL", ["gradient of tok_embeddings.weight at step 0 on rank 0 (stage 0): rel err 0.716"]),
    "mg_fault_accumulation_scaled_twice": ("FAIL", ["gradient of tok_embeddings.weight at step 0 on rank 0 (stage 0): "
                                                    "rel err 0.75"]),
    # NVIDIA/Megatron-LM#750, #1450: batched p2p to the one peer pairs sends and receives crosswise.
    "mg_interleaved_core_p2p_defaults": ("FAIL", ["loss at step 0: pipeline", "rel err"]),
    # NVIDIA/Megatron-LM#5100: the same defaults at pipeline size 4 hang.
    "mg_interleaved_pp4_core_p2p_defaults": ("TIMEOUT", ["still running after the", "deadline"]),
}

# The deadline of the framework suites' rows that must end TIMEOUT (a hang). Deadlines follow
# progress: past it, a row whose processes still use CPU time (a slow start on a busy runner) runs
# on, and one where none has for 10 s is ended as hung. mg_interleaved_pp4_core_p2p_defaults stops
# making progress about 10 s after it starts here, so it ends at about 30 s instead of the 300 s
# the other rows are allowed.
HANG_DEADLINE_S = 30


# --suite NAME for PyTorch's pipelining: its suite file.
TORCH_SUITES = {"torch": "scenarios/torch-pipelining.csv", "torch-moe": "scenarios/torch-moe.csv"}

# --suite NAME: (suite file, the trainer column its rows hold, the import that proves the framework
# is installed, what installs it, its expect=fail rows and the words each must hold, the fewest
# expect=pass rows it must have).
FRAMEWORKS = {
    "torchtitan": ("scenarios/torchtitan.csv", "torchtitan", "torchtitan.trainer", "requirements.txt", TITAN_FAILURES, 5),
    "deepspeed": ("scenarios/deepspeed.csv", "deepspeed", "deepspeed.pipe", "requirements-frameworks.txt",
                  DEEPSPEED_FAILURES, 6),
    "megatron": ("scenarios/megatron.csv", "megatron", "megatron.core.pipeline_parallel", "requirements-frameworks.txt",
                 MEGATRON_FAILURES, 6),
}


def torch_version():
    import torch
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def failure_words(name, version):
    """(status, the words `name`'s message must hold) on PyTorch `version`, or None where none are
    written. A reason is its words (the row ends ERROR) or a (status, words) pair."""
    reasons = {since: words for since, words in TORCH_FAILURES.get(name, {}).items() if since <= version}
    if not reasons:
        return None
    reason = reasons[max(reasons)]
    return reason if isinstance(reason, tuple) else ("ERROR", reason)


def run(pipecheck, suite, out, timeout, only=""):
    command = [pipecheck, "run", "--scenarios", suite, "--out", out, "--timeout", str(timeout)]
    done = subprocess.run(command + (["--only", only] if only else []),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(done.stdout[-3000:])
    with open(os.path.join(out, "summary.csv"), newline="") as f:
        return done.returncode, {row["scenario"]: row for row in csv.DictReader(f)}


def accounts(out, rows, names):
    """Problems with the action accounts (ranks.csv's forward_ms ... other_ms, from the trainer's
    "actions_ms") of `names`' rows on the CPU: every rank of a passing row must say where its step
    went, its forwards and backwards taking time and its kinds not exceeding its step."""
    with open(os.path.join(out, "ranks.csv"), newline="") as f:
        ranks = list(csv.DictReader(f))
    problems = []
    for name in names:
        row = rows.get(name)
        if row is None or row["status"] != "PASS" or row["device"] != "cpu":
            continue
        held = [rank for rank in ranks if rank["scenario"] == name]
        if not held:
            problems.append(f"{name}: no rank in ranks.csv")
        for rank in held:
            where = f"{name} rank {rank['rank']} replica {rank.get('replica', '0')}"
            if any(rank.get(column, "") == "" for column in ACCOUNT):
                problems.append(f"{where}: no account of its step's actions in ranks.csv")
                continue
            ms = {column: float(rank[column]) for column in ACCOUNT}
            compute = ms["backward_ms"] + ms["input_grad_ms"] + ms["weight_grad_ms"]
            if not (ms["forward_ms"] > 0 and compute > 0 and ms["other_ms"] >= 0):
                problems.append(f"{where}: the account {ms} does not hold forwards, backwards and a step's rest")
    return problems


# ranks.csv's account of a rank's step by kind of work.
ACCOUNT = ("forward_ms", "backward_ms", "input_grad_ms", "weight_grad_ms", "other_ms")


def check(rows, expected):
    problems = []
    for name, (status, words) in expected.items():
        row = rows.get(name)
        if row is None:
            problems.append(f"{name}: no row in summary.csv")
            continue
        if row["status"] != status:
            problems.append(f"{name}: status {row['status']}, expected {status}: {row['message']}")
        problems += [f"{name}: message lacks {word!r}: {row['message']}" for word in words if word not in row["message"]]
    return problems


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pipecheck", required=True)
    parser.add_argument("--source", required=True, help="the source tree")
    parser.add_argument("--suite", choices=["external", *TORCH_SUITES, *FRAMEWORKS], required=True)
    parser.add_argument("--only", default="",
                        help="--suite torch: only the rows these comma-separated globs name (pipecheck run --only)")
    args = parser.parse_args()
    if args.suite in FRAMEWORKS:
        _, trainer, module, pins, _, _ = FRAMEWORKS[args.suite]
        try:  # this Python is the one pipecheck runs trainers with (the build's)
            importlib.import_module(module)
        except ImportError as error:
            print(f"SKIP: trainer={trainer} needs {module} ({pins} pins it) ({error})")
            sys.exit(77)
    try:  # this Python is the one pipecheck runs trainers with (the build's)
        import torch.distributed.pipelining  # noqa: F401
    except ImportError as error:
        print(f"SKIP: trainer=torch needs PyTorch >= 2.4 with torch.distributed.pipelining ({error})")
        sys.exit(77)
    with tempfile.TemporaryDirectory(prefix="pipecheck_trainers_") as out:
        if args.suite == "external":
            code, rows = run(args.pipecheck, os.path.join(args.source, "tests/data/external.csv"), out, 40)
            problems = check(rows, EXTERNAL)
            if code != 0:
                problems.append(f"pipecheck run exited {code}: every row should have met its expectation")
            for row in rows.values():
                if row["trainer"] != ("torch" if row["scenario"].startswith("torch_") else
                                      "external:../../examples/plain_trainer.py"):
                    problems.append(f"{row['scenario']}: summary.csv's trainer is {row['trainer']!r}")
        elif args.suite in FRAMEWORKS:
            path, trainer, _, _, failures, fewest = FRAMEWORKS[args.suite]
            suite = os.path.join(args.source, path)
            with open(suite, newline="") as f:
                written = {row["name"]: row for row in csv.DictReader(line for line in f if not line.lstrip().startswith("#"))}
            # Rows that must hang run on their own, at a deadline that proves the hang without
            # spending the 300 s the other rows may need on a busy runner.
            hangs = [name for name in written if failures.get(name, ("",))[0] == "TIMEOUT"]
            code, rows = run(args.pipecheck, suite, out, 300, ",".join(n for n in written if n not in hangs))
            if hangs:
                hung = os.path.join(out, "hangs")
                hang_code, hang_rows = run(args.pipecheck, suite, hung, HANG_DEADLINE_S, ",".join(hangs))
                code, rows = max(code, hang_code), {**rows, **hang_rows}
            if sorted(written) != sorted(rows):
                sys.exit(f"FAIL: summary.csv's rows {sorted(rows)} are not the suite's {sorted(written)}")
            expected = {}
            for name, row in written.items():
                if row["expect"] == "pass":
                    expected[name] = ("PASS", ["weights after each step match"])
                elif name in failures:
                    expected[name] = failures[name]
                else:
                    sys.exit(f"FAIL: {name} is expect=fail but this test does not say which reason it must give")
            problems = check(rows, expected)
            if code != 0:
                problems.append(f"pipecheck run exited {code}: every row should have met its expectation")
            passing = [name for name, row in written.items() if row["expect"] == "pass"]
            if len(passing) < fewest:
                problems.append(f"only {len(passing)} expect=pass rows: {trainer} must be verified on at least {fewest}")
            problems += [f"{name}: trainer {row['trainer']!r}" for name, row in rows.items() if row["trainer"] != trainer]
            # Where each step's time went, by the framework's own functions (the hang rows end
            # before any step).
            problems += accounts(out, rows, [name for name in written if name not in hangs])
        else:
            suite = os.path.join(args.source, TORCH_SUITES[args.suite])
            code, rows = run(args.pipecheck, suite, out, 300, args.only)
            # Each row's expectation as this build resolved it (summary.csv's expect: an
            # OUTCOME<VERSION in the suite is pass or fail for the PyTorch built against).
            version, expected = torch_version(), {}
            with open(suite, newline="") as f:
                names = [row["name"] for row in csv.DictReader(line for line in f if not line.lstrip().startswith("#"))]
            if args.only:
                names = [name for name in names if any(fnmatch.fnmatchcase(name, glob) for glob in args.only.split(","))]
            if sorted(names) != sorted(rows):
                sys.exit(f"FAIL: summary.csv's rows {sorted(rows)} are not the suite's {sorted(names)}")
            for name, row in rows.items():
                if row["expect"] == "pass":
                    expected[name] = ("PASS", ["weights after each step match"])
                    continue
                reason = failure_words(name, version)
                if reason is None:
                    sys.exit(f"FAIL: {name} is expect=fail on PyTorch {version[0]}.{version[1]} but this test does not "
                             "say which reason it must give")
                expected[name] = reason
            problems = check(rows, expected)
            if args.suite == "torch-moe":
                # The balance loss's own parity, beside the total's, on every passing row that has one.
                for name, row in rows.items():
                    if row["status"] != "PASS" or name.endswith("_no_aux"):
                        continue
                    if "_bias_" in name and "expert biases and their routing counts bitwise equal" not in row["message"]:
                        problems.append(f"{name}: the expert biases' bitwise parity is not shown: {row['message']}")
                    if row.get("aux_loss_ref", "") == "":
                        continue  # aux_loss 0: no balance loss to show
                    rel = row.get("aux_loss_max_rel_err", "")
                    if rel == "" or not float(rel) <= 1e-9:
                        problems.append(f"{name}: aux_loss_max_rel_err {rel!r}: the balance loss's parity must be shown "
                                        "within 1e-9")
            if code != 0:
                problems.append(f"pipecheck run exited {code}: every row should have met its expectation")
            problems += [f"{name}: trainer {row['trainer']!r}" for name, row in rows.items() if row["trainer"] != "torch"]
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        sys.exit(1)
    print(f"PASS: {len(rows)} rows")


if __name__ == "__main__":
    main()
