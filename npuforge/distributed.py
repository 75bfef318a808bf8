"""One process or many: ``torchrun --nproc_per_node N -m npuforge zoo train | eval | quantize ...``
sets RANK / WORLD_SIZE / LOCAL_RANK; gloo on CPU, nccl on CUDA. Training shards its batches,
evaluation its images, calibration its batches (consecutive runs of them, so the merged
statistics are those of one process: :func:`npuforge.quant.calibrate.merge_shards`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Distributed:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    @classmethod
    def from_env(cls, device: str = "auto") -> "Distributed":
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
        cuda = torch.cuda.is_available() and device in ("auto", "cuda")
        dev = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(dev)
        if world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo")
        return cls(rank, world, local, dev)

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over processes (float64; exact for integer counts below 2^53)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.active:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def gather(self, obj) -> list:
        """Every process's ``obj`` (picklable), in rank order."""
        if not self.active:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def shard(self, n: int) -> range:
        """This process's consecutive share of ``n`` items (shares differ by at most one)."""
        return range(self.rank * n // self.world, (self.rank + 1) * n // self.world)

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def close(self) -> None:
        """Leave together: a process that tears gloo down while another still talks to it
        aborts that one ("terminate called without an active exception")."""
        if self.active and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
