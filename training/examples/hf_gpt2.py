"""A Hugging Face `transformers` GPT-2 trained under longrun's guard: a second, real training loop.

What it shows: a loop longrun did not write, on the public job-side API (training.api) and nothing else.

- real text every machine has: the Python standard library's own source files (the first `--files` of
  the sorted `*.py` at the top of `sysconfig.get_paths()["stdlib"]`);
- a byte-level BPE tokenizer (`tokenizers`) trained on that text at start, deterministically: every rank
  trains its own and the ranks compare a hash of their token streams before training;
- a GPT-2 from `transformers`, built from a config (no downloaded weights), dropout on, the same initial
  weights on every rank (seeded);
- a data loader whose state is checkpointed (`Blocks`: epoch and position; a per-rank shard, shuffled per
  epoch from a seed), AdamW with a linear warm-up then a cosine decay (`LambdaLR`), gradient clipping
  (under DDP);
- `LONGRUN_PARALLELISM` honoured: `ddp` through `Guard.prepare`; `hsdp` and `fsdp` through
  `Guard.prepare_sharded` on `Guard.device_mesh` (FSDP2, the optimizer and scheduler built after sharding);
- `loss_fn(model, batch) = model(**batch).loss`.

The guard owns the step order (DDP, the finite check, the cross-node recompute, the weight vote, saves,
records, the verdict) and resumes the model, optimizer, scheduler, the loader and the RNG. Run it under
torchrun or longrun's launch (entrypoint `module:training.examples.hf_gpt2`); every longrun setting comes
from the environment (LONGRUN_RUN_DIR, LONGRUN_STEPS, ...: GuardConfig.from_env):

    LONGRUN_RUN_DIR=runs/gpt2 LONGRUN_STEPS=40 LONGRUN_NODE_NAMES=n1,n2,n3 \\
        python -m torch.distributed.run --nproc-per-node 3 -m training.examples.hf_gpt2 --batch-size 8

Needs the optional extra `hf` (`pip install -e '.[hf]'`). Exit codes as the reference trainer's: 0 done,
93 an SDC verdict, 2 bad arguments or a set-up the ranks disagree on.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import logging
import math
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

try:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(
        f"training.examples.hf_gpt2 needs the optional 'hf' extra (transformers, tokenizers): "
        f"pip install -e '.[hf]' ({e})"
    ) from e

from training.api.guard import Guard, SetupError
from training.config import GuardConfig, checks_for_parallelism, parallelism_from_env

log = logging.getLogger("training.examples.hf_gpt2")

BLOCK = 128
"""Tokens per sequence (GPT-2's n_positions); `labels=input_ids`, the model shifts them itself."""
EOT = "<|endoftext|>"


def stdlib_texts(count: int) -> list[str]:
    """The first `count` readable `*.py` files at the top of the standard library, by sorted path."""
    texts = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
        if len(texts) == count:
            break
    if not texts:
        raise SetupError(f"no readable *.py under {sysconfig.get_paths()['stdlib']}")
    return texts


def token_stream(texts: list[str], vocab_size: int) -> tuple[torch.Tensor, int, int]:
    """Train a byte-level BPE tokenizer on `texts` and encode them, one EOT token after each. Returns the
    stream (int64), the tokenizer's vocabulary size and the EOT token's id."""
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(
        texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT], show_progress=False
    )
    eot = tok.token_to_id(EOT)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.int64), tok.get_vocab_size(), eot


class Blocks:
    """This rank's micro-batches of `BLOCK`-token sequences, forever: the stream is cut into blocks, rank r
    owns every W-th block, and each epoch visits its shard in an order drawn from (seed, rank, epoch).
    `state_dict()` is (epoch, position): a resumed loader yields exactly the next micro-batch."""

    def __init__(
        self, stream: torch.Tensor, *, batch_size: int, rank: int, world: int, seed: int, device: torch.device
    ) -> None:
        blocks = stream[: len(stream) // BLOCK * BLOCK].view(-1, BLOCK)
        self.shard = blocks[rank::world][: len(blocks) // world]  # the same count on every rank
        if len(self.shard) < batch_size:
            raise SetupError(f"{len(self.shard)} blocks per rank, fewer than a micro-batch of {batch_size}")
        self.batch_size, self.rank, self.seed, self.device = batch_size, rank, seed, device
        self.epoch, self.position = 0, 0
        self._order: tuple[int, torch.Tensor] | None = None

    def order(self) -> torch.Tensor:
        if self._order is None or self._order[0] != self.epoch:
            key = hashlib.sha256(f"hf_gpt2:{self.seed}:{self.rank}:{self.epoch}".encode()).digest()
            g = torch.Generator().manual_seed(int.from_bytes(key[:8], "little") >> 1)
            self._order = (self.epoch, torch.randperm(len(self.shard), generator=g))
        return self._order[1]

    def __iter__(self) -> Blocks:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if (self.position + 1) * self.batch_size > len(self.shard):  # the rest of the epoch is dropped
            self.epoch, self.position = self.epoch + 1, 0
        start = self.position * self.batch_size
        x = self.shard[self.order()[start : start + self.batch_size]].to(self.device)
        self.position += 1
        return {"input_ids": x, "labels": x}

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def warmup_cosine(steps: int, warmup: int) -> Any:
    """The LR factor of step s: linear from 1/warmup up to 1, then a cosine down to 0.1 at `steps`."""

    def factor(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        progress = (s - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def loss_fn(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).loss


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m training.examples.hf_gpt2", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--files", type=int, default=60, help="standard-library source files to train on")
    p.add_argument("--vocab-size", type=int, default=2048, help="BPE vocabulary size")
    p.add_argument("--batch-size", type=int, default=8, help=f"sequences of {BLOCK} tokens per rank and step")
    p.add_argument("--lr", type=float, default=1e-3, help="peak AdamW learning rate")
    p.add_argument("--warmup", type=float, default=0.1, help="warm-up, as a fraction of the steps")
    p.add_argument("--weight-decay", type=float, default=0.1)
    return p


def train(cfg: GuardConfig, args: argparse.Namespace, parallelism: str = "ddp") -> int:
    guard = Guard(cfg)  # the process group, the records; drills from LONGRUN_FAULTS
    stream, vocab, eot = token_stream(stdlib_texts(args.files), args.vocab_size)
    # Every rank trained its own tokenizer: the token streams must be the same bits everywhere.
    digest = hashlib.sha256(stream.numpy().tobytes()).hexdigest()
    digests: list[Any] = [None] * guard.world
    dist.all_gather_object(digests, digest)
    if len(set(digests)) != 1:
        guard.close(error=True)
        raise SetupError(f"the ranks' tokenizers disagree (token stream sha256 by rank: {digests})")
    log.info("%d tokens (vocabulary %d, sha256 %s)", len(stream), vocab, digest[:16])

    torch.manual_seed(cfg.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    config = GPT2Config(  # dropout (resid, embd, attn) at its default, 0.1
        n_layer=2, n_embd=128, n_head=4, n_positions=BLOCK, vocab_size=vocab,
        bos_token_id=eot, eos_token_id=eot,
    )  # fmt: skip
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # what transformers falls back to for this class, minus its warning
    warmup = max(1, round(args.warmup * cfg.steps))

    def adamw(params: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay, foreach=False)

    def schedule(optimizer: torch.optim.Optimizer) -> Any:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(cfg.steps, warmup))

    data = Blocks(stream, batch_size=args.batch_size, rank=guard.rank, world=guard.world, seed=cfg.seed,
                  device=guard.device)  # fmt: skip
    if parallelism == "ddp":
        optimizer = adamw(model.parameters())
        guard.prepare(model, optimizer, loss_fn=loss_fn, scheduler=schedule(optimizer), state={"data": data})
    else:  # FSDP2 over the mesh longrun's launch asked for; the guard shards the root module
        mesh = guard.device_mesh(parallelism)
        guard.prepare_sharded(
            model, mesh=mesh, loss_fn=loss_fn, make_optimizer=adamw, make_scheduler=schedule,
            state={"data": data},
        )  # fmt: skip
    return guard.run(data)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one core per rank, as torch's threads
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s r{rank} %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        parallelism = parallelism_from_env()  # LONGRUN_PARALLELISM: ddp, fsdp or hsdp
        # LONGRUN_RUN_DIR, LONGRUN_STEPS, cadences, resume point; gradient clipping (on shards by the whole
        # model's norm), and no weight vote under fsdp (nothing is replicated to vote with).
        overrides: dict[str, Any] = {"grad_clip": 1.0}
        base = GuardConfig.from_env().checks
        overrides["checks"] = dataclasses.replace(
            base, checks=checks_for_parallelism(parallelism, base.checks)
        )
        cfg = GuardConfig.from_env(**overrides)
    except ValueError as e:
        print(f"{build_parser().prog}: {e}", file=sys.stderr)
        return 2
    try:
        return train(cfg, args, parallelism)
    except SetupError as e:
        log.error("%s", e)
        return 2


if __name__ == "__main__":
    sys.exit(main())
