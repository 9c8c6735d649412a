#!/usr/bin/env python3
"""PyTorch pipelining's compute-only schedule CSV, both ways, checked by PyTorch and by pipecheck.

1. pipecheck -> PyTorch: every schedule pipecheck generates (GPipe, 1F1B, interleaved, ZB-H1, ZB-V, DualPipeV,
   on 2 and 4 ranks), written by `pipecheck schedule --csv`, is loaded by PyTorch's own
   `_PipelineScheduleRuntime._load_csv` (which runs PyTorch's `_validate_schedule` and lowers it
   with PyTorch's `_add_send_recv`), reads back cell for cell, and PyTorch's dry-run simulator
   `_simulate_comms_compute` runs the lowered schedule to the end without a deadlock.
2. PyTorch -> pipecheck: for each PyTorch schedule class (GPipe, 1F1B, Interleaved1F1B, LoopedBFS,
   InterleavedZeroBubble, ZBVZeroBubble, DualPipeV), the `pipeline_order` PyTorch builds is
   written as PyTorch's `_dump_csv` writes it, imported into pipecheck as `csv:PATH` and run
   end to end with full parity against the reference (real ranks, `pipecheck run`). Where
   PyTorch's own validator rejects a class's `pipeline_order` (Schedule1F1B's in PyTorch 2.11:
   the last rank starts at microbatch 1 and ends at microbatch m), pipecheck must reject that
   file too, naming its row and cell; a class PyTorch accepts must pass in pipecheck.

3. pipecheck's own dualpipev, loopedbfs and zbv generators build, on every rank, the very
   actions PyTorch's ScheduleDualPipeV (its overlapped forward-backward pairs as their two
   sub-actions), ScheduleLoopedBFS and ScheduleZBVZeroBubble build.

The schedule classes only need their stages' indices to build `pipeline_order`, so they are
given stand-ins holding exactly those (no process group, nothing runs in PyTorch here).

Usage: pytorch_schedule_csv_test.py PIPECHECK WORKDIR
"""
import csv
import os
import re
import shutil
import subprocess
import sys
import types

import torch
from torch.distributed.pipelining import schedules

PIPECHECK_SCHEDULES = [  # (name, ranks, virtual stages, microbatches)
    ("gpipe", 2, 1, 4), ("gpipe", 4, 1, 8),
    ("1f1b", 2, 1, 4), ("1f1b", 4, 1, 8),
    ("interleaved", 2, 2, 4), ("interleaved", 4, 2, 8),
    ("zbh1", 2, 1, 4), ("zbh1", 4, 1, 8),
    ("zbv", 2, 2, 4), ("zbv", 4, 2, 8),
    ("dualpipev", 2, 2, 4), ("dualpipev", 4, 2, 8),
    ("loopedbfs", 2, 2, 4), ("loopedbfs", 4, 3, 8),
]
V_PLACED = {"zbv", "dualpipev"}

# pipecheck's generators against PyTorch's classes, action for action (PyTorch's overlapped F&B
# pairs as their two sub-actions, forward first): (pipecheck name, PyTorch class, V placement,
# [(ranks, virtual stages, microbatches)]).
GENERATOR_TWINS = [
    ("dualpipev", "ScheduleDualPipeV", True,
     [(1, 2, 2), (1, 2, 5), (2, 2, 4), (2, 2, 7), (3, 2, 6), (3, 2, 10), (4, 2, 8), (4, 2, 13)]),
    ("loopedbfs", "ScheduleLoopedBFS", False,
     [(1, 3, 3), (2, 2, 4), (2, 3, 5), (3, 2, 7), (4, 2, 8), (4, 4, 3)]),
    # Below m = 2p - 1 too, where PyTorch counts microbatches past m and leaves them out.
    ("zbv", "ScheduleZBVZeroBubble", True,
     [(1, 2, 1), (1, 2, 4), (2, 2, 1), (2, 2, 2), (2, 2, 4), (2, 2, 8), (3, 2, 3), (3, 2, 7), (4, 2, 8), (4, 2, 13)]),
]

PYTORCH_CLASSES = [  # (class name, ranks, virtual stages, microbatches, V placement)
    ("ScheduleGPipe", 2, 1, 4, False),
    ("Schedule1F1B", 2, 1, 4, False),
    ("ScheduleInterleaved1F1B", 2, 2, 4, False),
    ("ScheduleLoopedBFS", 2, 2, 4, False),
    ("ScheduleInterleavedZeroBubble", 2, 2, 4, False),
    ("ScheduleZBVZeroBubble", 2, 2, 4, True),
    ("ScheduleDualPipeV", 2, 2, 4, True),
    ("ScheduleInterleaved1F1B", 4, 2, 8, False),
    ("ScheduleZBVZeroBubble", 4, 2, 8, True),
    ("ScheduleDualPipeV", 4, 2, 8, True),
]

# The scenario every imported schedule runs: small, float64, variable lengths, uneven layers.
SCENARIO_COLUMNS = "name,flavor,layers,hidden,heads,vocab,world_size,virtual_stages,schedule,batch,microbatches," \
                   "seq_len,seq_len_min,dtype,steps"


def stand_in_stages(ranks, virtual, v_placement, rank=0):
    """What the schedule classes read of their stages: indices, sizes, first/last."""
    stages = ranks * virtual
    if v_placement:
        indices = [rank, 2 * ranks - 1 - rank]
    else:
        indices = [rank + i * ranks for i in range(virtual)]
    return [types.SimpleNamespace(stage_index=i, num_stages=stages, group_size=ranks, group_rank=rank,
                                  is_first=i == 0, is_last=i == stages - 1, submod=None) for i in indices]


def make_schedule(class_name, ranks, virtual, microbatches, v_placement):
    cls = getattr(schedules, class_name)
    stages = stand_in_stages(ranks, virtual, v_placement)
    loss = lambda output, target: output.sum()  # noqa: E731 (never called: nothing runs)
    if issubclass(cls, schedules.PipelineScheduleSingle):
        return cls(stages[0], microbatches, loss_fn=loss, scale_grads=False)
    return cls(stages, microbatches, loss_fn=loss, scale_grads=False)


def write_pipeline_order(schedule, path):
    """The compute-only CSV as PyTorch's PipelineScheduleMulti._dump_csv writes it (csv.writer,
    one row per rank of pipeline_order; None is an empty cell). Single-stage classes have no
    _dump_csv; their pipeline_order is written the same way."""
    if isinstance(schedule, schedules.PipelineScheduleMulti):
        schedules.PipelineScheduleMulti._dump_csv(schedule, path)
        return
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        for rank in schedule.pipeline_order:
            writer.writerow(schedule.pipeline_order[rank])


def pytorch_validates(order, ranks, stages, microbatches):
    """PyTorch's _validate_schedule on a pipeline_order: None when it passes, else its first line."""
    try:
        schedules._validate_schedule(order, ranks, stages, microbatches)
        return None
    except AssertionError as error:
        return str(error).splitlines()[0]


def check_pipecheck_to_pytorch(pipecheck, workdir):
    failures = []
    for name, ranks, virtual, microbatches in PIPECHECK_SCHEDULES:
        label = f"pipecheck {name} p={ranks} v={virtual} m={microbatches}"
        path = os.path.join(workdir, f"pipecheck_{name}_{ranks}x{virtual}_m{microbatches}.csv")
        command = [pipecheck, "schedule", "--schedule", name, "--stages", str(ranks), "--microbatches",
                   str(microbatches), "--csv", path]
        if virtual > 1:
            command += ["--virtual", str(virtual)]
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            failures.append(f"{label}: pipecheck schedule --csv exited {done.returncode}: {done.stderr.strip()}")
            continue
        with open(path, newline="") as f:
            cells = list(csv.reader(f))
        runtime = schedules._PipelineScheduleRuntime(
            stand_in_stages(ranks, virtual, name in V_PLACED), microbatches, loss_fn=lambda o, t: o.sum(),
            scale_grads=False)
        try:
            runtime._load_csv(path, format="compute_only")
        except Exception as error:  # PyTorch's validator raises AssertionError, its lowering others
            failures.append(f"{label}: PyTorch's _load_csv refused it: {str(error).splitlines()[0]}")
            continue
        read_back = [[str(action) for action in runtime.pipeline_order[rank]] for rank in range(ranks)]
        if read_back != cells:
            failures.append(f"{label}: PyTorch read back {read_back}, the file holds {cells}")
            continue
        # PyTorch's lowering adds UNSHARD/RESHARD (FSDP) and REDUCE_GRAD, which its dry-run
        # simulator has no rule for and which order nothing between ranks: it runs the compute
        # and send/receive actions of the lowered schedule.
        lowered = {rank: [a for a in actions if a is not None and a.computation_type in (
                       schedules.F, schedules.B, schedules.I, schedules.W, schedules.SEND_F, schedules.RECV_F,
                       schedules.SEND_B, schedules.RECV_B)]
                   for rank, actions in runtime.pipeline_order_with_comms.items()}
        try:
            simulated = schedules._simulate_comms_compute(lowered, lambda s: runtime.stage_index_to_group_rank[s],
                                                          ranks * virtual)
        except ValueError as error:
            failures.append(f"{label}: PyTorch's simulator: {error}")
            continue
        steps = max(len(actions) for actions in simulated.values())
        print(f"PASS {label}: PyTorch loads, validates and lowers it; its simulator runs it in {steps} steps")
    return failures


def flat_actions(actions):
    """A rank's compute actions as text, PyTorch's OVERLAP_F_B as its sub-actions in order."""
    flat = []
    for action in actions:
        if action is None:
            continue
        if getattr(action, "sub_actions", None):
            flat.extend(str(sub) for sub in action.sub_actions)
        else:
            flat.append(str(action))
    return flat


def check_generators_match_pytorch(pipecheck, workdir):
    failures = []
    for name, class_name, v_placement, shapes in GENERATOR_TWINS:
        for ranks, virtual, microbatches in shapes:
            label = f"{name} p={ranks} v={virtual} m={microbatches}"
            path = os.path.join(workdir, f"{name}_{ranks}x{virtual}_m{microbatches}.csv")
            done = subprocess.run([pipecheck, "schedule", "--schedule", name, "--stages", str(ranks), "--virtual",
                                   str(virtual), "--microbatches", str(microbatches), "--csv", path],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if done.returncode != 0:
                failures.append(f"{label}: pipecheck schedule exited {done.returncode}: {done.stderr.strip()}")
                continue
            with open(path, newline="") as f:
                ours = [[cell for cell in row if cell] for row in csv.reader(f)]
            theirs = make_schedule(class_name, ranks, virtual, microbatches, v_placement)
            for rank in range(ranks):
                expected = flat_actions(theirs.pipeline_order[rank])
                if ours[rank] != expected:
                    first = next((i for i, (a, b) in enumerate(zip(ours[rank], expected)) if a != b),
                                 min(len(ours[rank]), len(expected)))
                    failures.append(f"{label} rank {rank}: differs from PyTorch's {class_name} at action {first}: "
                                    f"pipecheck {ours[rank][first:first + 4]}, PyTorch {expected[first:first + 4]}")
                    break
            else:
                print(f"PASS {label}: the same actions as PyTorch's {class_name} on every rank")
    return failures


def check_pytorch_to_pipecheck(pipecheck, workdir):
    failures = []
    rows, expected = [], {}
    for class_name, ranks, virtual, microbatches, v_placement in PYTORCH_CLASSES:
        label = f"{class_name} p={ranks} v={virtual} m={microbatches}"
        scenario = f"{class_name}_{ranks}x{virtual}_m{microbatches}"
        path = os.path.join(workdir, f"{scenario}.csv")
        schedule = make_schedule(class_name, ranks, virtual, microbatches, v_placement)
        write_pipeline_order(schedule, path)
        verdict = pytorch_validates(schedule.pipeline_order, ranks, ranks * virtual, microbatches)
        suite = os.path.join(workdir, f"{scenario}_suite.csv")
        with open(suite, "w") as f:
            # 5 layers over 2p or p stages: uneven, and with p = 4 and v = 2 some stages are empty.
            f.write(SCENARIO_COLUMNS + "\n")
            f.write(f"{scenario},llama,5,32,4,64,{ranks},{virtual},csv:{os.path.basename(path)},{2 * microbatches},"
                    f"{microbatches},12,5,float64,2\n")
        out = os.path.join(workdir, f"{scenario}_out")
        done = subprocess.run([pipecheck, "run", "--scenarios", suite, "--out", out, "--threads", "1"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if verdict is not None:
            # PyTorch's own validator refuses this pipeline_order: pipecheck must refuse the file
            # before anything runs (exit 2), naming the file's row and cell.
            named = re.search(rf"{re.escape(os.path.basename(path))}: row \d+, cell \d+: ", done.stdout)
            if done.returncode != 2 or not named:
                failures.append(f"{label}: PyTorch's validator rejects its pipeline_order ({verdict}) but pipecheck "
                                f"exited {done.returncode}:\n{done.stdout[-2000:]}")
                continue
            message = done.stdout[named.start():].splitlines()[0]
            print(f"REJECTED {label}: PyTorch's _validate_schedule: {verdict}; pipecheck: {message}")
            continue
        status = ""
        summary = os.path.join(out, "summary.csv")
        if os.path.exists(summary):
            with open(summary, newline="") as f:
                status = next(csv.DictReader(f), {}).get("status", "")
        if done.returncode != 0 or status != "PASS":
            failures.append(f"{label}: pipecheck run exited {done.returncode}, status {status!r}:\n{done.stdout[-3000:]}")
            continue
        print(f"PASS {label}: PyTorch's pipeline_order imported as csv:, run with parity on {ranks} ranks")
    return failures


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    pipecheck, workdir = sys.argv[1], sys.argv[2]
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    print(f"torch {torch.__version__}")
    failures = (check_pipecheck_to_pytorch(pipecheck, workdir) + check_generators_match_pytorch(pipecheck, workdir) +
                check_pytorch_to_pipecheck(pipecheck, workdir))
    for failure in failures:
        print("FAIL " + failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
