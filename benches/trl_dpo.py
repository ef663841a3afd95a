"""TRL's DPOTrainer on CPU or one GPU, timed the way `benches/throughput.rs` times dpo-train.

Usage: python benches/trl_dpo.py MODEL_DIR DATA_JSONL --batch-size B --max-length L --steps N
                                 --threads T [--precompute] [--bf16] [--device cpu|cuda]
                                 [--no-cudnn-attention] [--gradient-checkpointing] [--liger]
                                 [--lora-r R]

Trains N optimizer steps of `per_device_train_batch_size = B` pairs (no accumulation, no evaluation,
no checkpoints, the default sigmoid loss, AdamW) and prints one JSON line:
{"pairs_per_second": ..., "seconds": ..., "steps": ..., "peak_bytes": ...},
measured from the end of step 1 to the end of step N (step 1 pays for warm-up), excluding the
reference precomputation. `peak_bytes` is the peak resident set while training on CPU (the peak is
reset just before `train()`, as dpo-train resets its own), the peak allocated CUDA memory on a GPU.
`--no-cudnn-attention` turns cuDNN's fused attention off (`torch.backends.cuda.enable_cudnn_sdp`),
as dpo-train does on CUDA: torch picks it for half precision on Hopper, where it builds a graph per
input shape; TRL as installed keeps torch's choice. `--gradient-checkpointing` is TRL 1.16's
default (off here unless asked, as dpo-train's side runs without it unless asked);
`--liger` sets `use_liger_kernel=True` (liger-kernel's fused linear DPO loss and its model kernels;
it needs the liger-kernel package and a CUDA device). `--lora-r R` trains PEFT LoRA adapters of
rank R (alpha 2R, no dropout, PEFT's default targets for the model type: q_proj and v_proj for
Llama) on a base loaded in bf16 with `--bf16` (as a PEFT user loads a large model), the reference
being the base with the adapters disabled (TRL's way with a PEFT model: no second copy).
"""

import argparse
import json
import tempfile
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import DPOConfig, DPOTrainer


class StepClock(TrainerCallback):
    def __init__(self):
        self.ends = []

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())


def reset_peak_resident() -> None:
    # Linux: writing 5 to clear_refs resets VmHWM to the current resident set.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_resident() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("data")
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--max-length", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--precompute", action="store_true")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--no-cudnn-attention", action="store_true")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--liger", action="store_true")
    p.add_argument("--lora-r", type=int, default=0)
    a = p.parse_args()
    cuda = a.device == "cuda"
    if a.no_cudnn_attention:
        torch.backends.cuda.enable_cudnn_sdp(False)

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    rows = [json.loads(line) for line in open(a.data) if line.strip()]
    tok = AutoTokenizer.from_pretrained(a.model)
    lora = None
    if a.lora_r:
        from peft import LoraConfig

        lora = LoraConfig(r=a.lora_r, lora_alpha=2 * a.lora_r, lora_dropout=0.0, task_type="CAUSAL_LM")
    dtype = torch.bfloat16 if lora is not None and a.bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype)
    ref = None if lora is not None else AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype)
    clock = StepClock()
    with tempfile.TemporaryDirectory() as out:
        args = DPOConfig(
            output_dir=out,
            use_cpu=not cuda,
            report_to=[],
            bf16=a.bf16,
            gradient_checkpointing=a.gradient_checkpointing,
            use_liger_kernel=a.liger,
            per_device_train_batch_size=a.batch_size,
            gradient_accumulation_steps=1,
            max_steps=a.steps,
            learning_rate=1e-6,
            lr_scheduler_type="constant",
            max_length=a.max_length,
            precompute_ref_log_probs=a.precompute,
            dataloader_num_workers=0,
            save_strategy="no",
            logging_strategy="no",
            eval_strategy="no",
            disable_tqdm=True,
            seed=42,
        )
        trainer = DPOTrainer(
            model=model,
            ref_model=None if a.precompute else ref,
            peft_config=lora,
            args=args,
            processing_class=tok,
            train_dataset=Dataset.from_list(rows),
            callbacks=[clock],
        )
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            reset_peak_resident()
        trainer.train()
        peak = torch.cuda.max_memory_allocated() if cuda else peak_resident()
    seconds = clock.ends[-1] - clock.ends[0]
    steps = len(clock.ends) - 1
    print(
        json.dumps(
            {
                "pairs_per_second": steps * a.batch_size / seconds,
                "seconds": seconds,
                "steps": steps,
                "peak_bytes": peak,
            }
        )
    )


if __name__ == "__main__":
    main()
