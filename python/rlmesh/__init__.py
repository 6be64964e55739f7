"""Python client of an rlmesh cluster.

    import rlmesh
    c = rlmesh.connect("127.0.0.1:7401", token=None)
    exp = c.submit("configs/grpo_arith_e2e.yaml", overrides=["stages[1].grpo.rl.steps=10"])
    c.wait(exp)
    curve = [r for r in c.metrics(exp) if r["event"] == "step"]
    for t in c.buffer().query(exp, min_reward=1.0, limit=5):
        print(t["step"], t["response_text"], t["reward"])
"""

from rlmesh.client import Buffer, Client, RlmeshError, connect

__all__ = ["Buffer", "Client", "RlmeshError", "connect"]
