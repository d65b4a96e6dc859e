"""ZeRO-3-style sharded generation: every decode step all-gathers the sharded weights, and each
rank stops decoding when its own sequence ends. Ranks whose sequences are shorter move on to the
loss all_reduce while the others still all-gather: a deadlock (the mechanism of docs/bugs.md's
sharded-generate hangs)."""

import torch
import torch.distributed as dist


def gather_weights(shard: torch.Tensor, world: int) -> torch.Tensor:
    full = [torch.empty_like(shard) for _ in range(world)]
    dist.all_gather(full, shard)  # ZeRO-3: parameters are gathered before every forward
    return torch.cat(full)


def generate(shard: torch.Tensor, world: int, length: int) -> list[int]:
    tokens = []
    for _ in range(length):  # each rank decodes until its own EOS
        weights = gather_weights(shard, world)
        tokens.append(int(weights.sum()) % 7)
    return tokens


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    shard = torch.ones(8) * rank
    for step in range(2):
        length = 4 if step == 0 else 4 + rank  # the second prompt: lengths differ per rank
        tokens = generate(shard, world, length)
        loss = torch.tensor([float(len(tokens))])
        dist.all_reduce(loss)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
