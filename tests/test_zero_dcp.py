"""ZeRO checkpoints and torch.distributed.checkpoint convert both ways
(hvdlite/torch/parallel/zero/dcp.py): a 2-rank ZeRO-2 job's checkpoint loads into a 2-rank FSDP2
job on the "hvdlite" backend with bitwise the same parameters and AdamW state, that job's next
step equals one process's, and its DCP checkpoint loads back into a ZeRO-3 job, again bitwise.
Body in tests/zero_dcp_cases.py."""

import zero_dcp_cases as cases
from helpers import run_pooled


def test_zero_and_dcp_checkpoints_convert_both_ways(tmp_path):
    for there, step_err, back in run_pooled(cases.round_trip, 2, args=(str(tmp_path),), timeout=120):
        # 4 parameters, each with AdamW's step, exp_avg and exp_avg_sq: 16 tensors each way
        assert there == ([], 16), there
        assert step_err < 1e-5, step_err
        assert back == ([], 16), back
