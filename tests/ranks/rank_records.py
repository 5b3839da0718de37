"""What the multi-rank test scripts beside this file share: a case run so that its failure is recorded, not raised
(one collective gloo lacks must not hide the other cases), and rank 0's records written once every rank is done."""
import json
import traceback

import torch.distributed as dist


def recorded(record: dict, case) -> dict:
    """``record`` with what ``case()`` returns, or with its error and traceback where it raises."""
    try:
        record.update(case())
    except Exception as err:  # e.g. a collective gloo lacks for CUDA tensors
        record["error"] = f"{type(err).__name__}: {err}"[:2000]
        record["traceback"] = traceback.format_exc()[-3000:]
    return record


def write_and_close(out: str, records) -> None:
    """Rank 0 writes ``records`` as JSON to ``out``; every rank then leaves the process group."""
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(records, f)
    dist.barrier()
    dist.destroy_process_group()
