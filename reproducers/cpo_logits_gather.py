"""docs/bugs.md A: CPO / SimPO / ORPO hang at step 0 (TRL #3068, fixed by #3069; ms-swift #3827).

What happens: the trainer gathers the policy logits ``[B, T, V]`` for its metrics. Each rank pads
its batch to its own longest sequence, so ``T`` differs between ranks. On NCCL the all-gather of
different sizes hangs with the GPUs at 100%: the rank with the smaller tensor finishes and goes on
to the next (scalar) collective, its peer waits for the rest of the big one.

On gloo a size-mismatched all-gather aborts instead (``--abort`` shows that; with ``--device cuda``
it is the bug as reported, an NCCL hang). By default the
logits are gathered one ``[B, 1, V]`` time step at a time, which gives gloo NCCL's behaviour: the
shorter rank finishes first and goes on to reduce the loss while its peer waits in the next
chunk. ``--fixed`` gathers ``logits.mean()``, as TRL's fix does.

    torchrun --nproc-per-node 2 -m nccl_doctor.reproducers.cpo_logits_gather [--fixed|--abort]
        [--device cuda]
"""

from __future__ import annotations

import argparse

import torch.distributed as dist

from nccl_doctor.trainers import placement, preference


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fixed", action="store_true", help="gather logits.mean() (TRL #3069)")
    p.add_argument("--abort", action="store_true",
                   help="gather the whole tensor at once: gloo's own abort (NCCL: a hang)")
    p.add_argument("--method", choices=("cpo", "simpo", "orpo"), default="cpo")
    p.add_argument("--steps", type=int, default=2)
    placement.add_options(p)
    args = p.parse_args(argv)
    gather = "scalar" if args.fixed else ("whole" if args.abort else "chunked")
    device = placement.init(p, args)

    def show(step: int, metrics: dict[str, float]) -> None:
        if dist.get_rank() == 0:
            print(f"step {step + 1}: loss {metrics['loss']:.4f}", flush=True)

    preference.train(args.method, steps=args.steps, gather_logits=gather, on_step=show,
                     device=device)
    dist.barrier()  # accelerator.wait_for_everyone()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
