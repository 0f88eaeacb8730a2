"""The last step of every multi-process test script: destroy torch's default process group.

Lightning's DDP strategies leave the process group alive at the end of ``trainer.fit``. A gloo
group still alive at interpreter exit has background threads that the C++ runtime then destroys
while they are joinable, and the process dies with SIGABRT ("terminate called without an active
exception") after its work is done, at random. Destroying the group on every rank first is the
documented teardown (torch.distributed: "call destroy_process_group() before exit").
"""

from __future__ import annotations

import torch.distributed as dist


def destroy_process_group() -> None:
    """Destroy the default process group if one is initialised; every rank calls this once."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
