"""LoRA as a lever and the model-size axis: the adapter itself (in process), the formulas, the
sweep axes, and real torchrun/gloo runs at every stage (model state and communication against
the LoRA formulas, first-step loss equal to the full-training twin's)."""


from scalelab.planning.sweep import RunPoint
from support import run_point, tiny_config


def test_lora_runs_at_every_stage_match_the_formulas(tmp_path, tiny_data, capsys):
    cfg = tiny_config(train={"steps": 4, "warmup_steps": 1}, planning={"launch_overcommitted": True})
    full, full_steps, _ = run_point(tmp_path, tiny_data, RunPoint("fp32", 0, 2), cfg=cfg)
    assert full["status"] == "ok", full["reason"]
    rows = []
    for stage in range(4):
        lora, steps, _ = run_point(tmp_path, tiny_data, RunPoint("fp32", stage, 2, lora_rank=8), cfg=cfg)
        assert lora["status"] == "ok", lora["reason"]
        assert lora["run_id"] == f"fp32-z{stage}-w2-lora8"
        # LoRA starts from exactly the twin's weights: the same first-step loss.
        assert steps["loss"].iloc[0] == full_steps["loss"].iloc[0]
        assert lora["n_trainable_params"] < lora["n_params"] / 5
        for kind in ("", "params_", "grads_", "optimizer_"):
            measured, predicted = lora[f"model_state_{kind}bytes_measured"], lora[f"model_state_{kind}bytes_predicted"]
            assert abs(measured - predicted) <= 0.05 * predicted, (stage, kind, measured, predicted)
        measured, predicted = lora["comm_bytes_per_step_measured"], lora["comm_bytes_per_step_predicted"]
        assert abs(measured - predicted) <= 0.05 * predicted, (stage, measured, predicted)
        rows.append((stage, lora["model_state_params_bytes_measured"], lora["model_state_params_bytes_predicted"],
                     lora["model_state_grads_bytes_measured"], lora["model_state_grads_bytes_predicted"],
                     lora["model_state_optimizer_bytes_measured"], lora["model_state_optimizer_bytes_predicted"],
                     lora["model_state_bytes_measured"], lora["model_state_bytes_predicted"],
                     lora["model_state_bytes_predicted_paper"], measured, predicted, full["model_state_bytes_measured"]))
    with capsys.disabled():
        print("\nstage params m/p | grads m/p | optimizer m/p | total m/p (paper) | comm m/p | full-training twin z0")
        for r in rows:
            print(" | ".join(str(round(x)) if isinstance(x, float) else str(x) for x in r))
