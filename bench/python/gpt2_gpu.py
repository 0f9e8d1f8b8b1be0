#!/usr/bin/python3
"""The single-process GPU anchor for dt's trainer benchmarks (trainer_bench.py gpu): the GPT-2 of
gpt2_ddp.py (the same classes, imported: pre-LayerNorm, tanh GELU, tied head, causal attention
written with matmul + mask as dttrainer does) trained in eager PyTorch, or under torch.compile,
doing each step the work dttrainer does: forward, loss, backward, clip_grad_norm_(1.0), AdamW
step, zero_grad. AdamW as dttrainer's defaults (trainer/trainer_config.h, MakeAdamW): lr 3e-4,
betas 0.9/0.95, weight decay 0.1 on matrices only (dim >= 2), not on biases and LayerNorm;
PyTorch's own AdamW implementation choice (foreach on CUDA), as users run it.

  python3 gpt2_gpu.py --n-embd 768 --n-layer 12 --n-head 12 --n-positions 1024 --seq-len 1024 \
      --batch-size 8 --steps 30 --warmup 5 --precision bf16 [--compile] [--device cuda]

--precision bf16: torch.autocast(device_type, dtype=torch.bfloat16) around forward and loss; the
weights, gradients and AdamW stay fp32; no grad scaler (bf16 has fp32's range). fp32: no autocast
(and no TF32 unless torch's defaults allow it: the result says which).

Random tokens of the vocabulary (50257) are drawn on the device before the first step, so no
step waits for data. Each step is timed with torch.cuda.synchronize() on CUDA. The --warmup steps
(torch.compile's compilation among them) are not timed. Prints one JSON line
"DT_BENCH_RESULT {...}": step_times, tokens_per_s (tokens per step over the median step time),
mfu, params, flops_per_token, precision, compile, device, torch version.
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_ddp import GPT2, add_shape_arguments  # noqa: E402

# Dense peak TFLOPS by device name, (bf16, fp32), from NVIDIA's data sheets: H100 and H200 SXM
# 989.4 bf16 (tensor cores, dense: without 2:4 sparsity) and 66.9 fp32 (CUDA cores, not tensor
# cores: fp32 matmuls without TF32); H100 PCIe 756.5 and 51.2; A100 312 and 19.5. The first
# pattern found in torch.cuda.get_device_name() wins. Unknown devices: pass --peak-tflops.
PEAK_TFLOPS = [
    ("H100 PCIe", {"bf16": 756.5, "fp32": 51.2}),
    ("H100", {"bf16": 989.4, "fp32": 66.9}),
    ("H200", {"bf16": 989.4, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp32": 19.5}),
]


def default_peak(device, device_name, precision):
    if device.type != "cuda":
        return 0.0  # CPU: no MFU
    for pattern, peaks in PEAK_TFLOPS:
        if pattern in device_name:
            return peaks[precision]
    return 0.0


def flops_per_token(model, n_layer, n_embd, seq_len):
    """Training FLOPs per token, the nanoGPT (estimate_mfu) / PaLM (appendix B) convention:
    6 N (forward 2 N, backward 4 N, N the parameters that multiply: all but the position
    embedding; the tied token embedding counts once, as the head's matmul) plus attention's
    12 x n_layer x n_embd x seq_len (QK^T and AV, forward and backward)."""
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    return 6 * n + 12 * n_layer * n_embd * seq_len


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_shape_arguments(ap, n_embd=768, n_layer=12, n_head=12, seq_len=1024, batch_size=8, steps=30)
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before them (compilation among them)")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (torch >= 2.0)")
    ap.add_argument("--device", default=None, help="cuda (the default when available), cuda:N or cpu")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="the device's dense peak for --precision, for MFU (default: by device name; 0: no MFU)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--profile-out", default=None,
                    help="write a Chrome trace (torch.profiler) of --profile-steps untimed warmup steps here, from "
                         "the second step (as dttrainer --profile-trace --profile-first-step 2)")
    ap.add_argument("--profile-steps", type=int, default=3)
    args = ap.parse_args()
    if args.seq_len > args.n_positions:
        ap.error("--seq-len %d exceeds --n-positions %d" % (args.seq_len, args.n_positions))
    if args.profile_out and args.warmup < args.profile_steps + 1:
        ap.error("--profile-out traces warmup steps 2 to %d: give --warmup %d or more" % (
            args.profile_steps + 1, args.profile_steps + 1))
    if args.compile and not hasattr(torch, "compile"):
        sys.exit("gpt2_gpu.py: --compile needs torch.compile (torch >= 2.0); this is torch %s" % torch.__version__)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("gpt2_gpu.py: --device %s but torch %s sees no CUDA device" % (device, torch.__version__))
        if device.index is not None:
            torch.cuda.set_device(device)
        device_name = torch.cuda.get_device_name(device)
    else:
        import platform
        device_name = "cpu (%s, %d threads)" % (platform.processor() or platform.machine(), torch.get_num_threads())

    torch.manual_seed(1337)
    model = GPT2(args.vocab, args.n_positions, args.n_embd, args.n_layer, args.n_head).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    run = torch.compile(model) if args.compile else model
    if args.precision == "bf16":
        autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16)
    else:
        autocast = contextlib.nullcontext

    total = args.warmup + args.steps
    gen = torch.Generator(device=device).manual_seed(1000)
    data = torch.randint(0, args.vocab, (total, args.batch_size, args.seq_len + 1), generator=gen, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    times = []
    # Warmup steps (untimed): the trace's own cost stays out of the step times.
    profiled = range(1, 1 + args.profile_steps) if args.profile_out else range(0)
    prof = None
    sync()
    for step in range(total):
        if step == profiled.start and profiled:
            sync()  # as dttrainer's --profile-trace: the window opens on an idle device
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU] + (
                [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []))
            prof.__enter__()
        t0 = time.perf_counter()
        batch = data[step]
        with autocast():
            loss = run(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
        if prof is not None and step == profiled[-1]:
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(args.profile_out)
            prof = None

    tokens_per_step = args.batch_size * args.seq_len
    tokens_per_s = tokens_per_step / statistics.median(times)
    fpt = flops_per_token(model, args.n_layer, args.n_embd, args.seq_len)
    peak = args.peak_tflops if args.peak_tflops is not None else default_peak(device, device_name, args.precision)
    result = {
        "step_times": times,
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * fpt / (peak * 1e12) if peak > 0 else None,
        "peak_tflops": peak,
        "params": sum(p.numel() for p in model.parameters()),
        "flops_per_token": fpt,
        "precision": args.precision,
        "compile": args.compile,
        "device": device_name,
        "torch": torch.__version__,
        # "highest": fp32 matmuls in fp32 (no TF32), torch's default.
        "fp32_matmul": torch.get_float32_matmul_precision() if hasattr(torch, "get_float32_matmul_precision") else "",
        "final_loss": loss.item(),
    }
    print("DT_BENCH_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
