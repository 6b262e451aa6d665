import os, sys, json, time
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch
torch.set_num_threads(1)
from pathlib import Path
from twin.cli import *  # noqa
import yaml
from scenarios.schema import Scenario
import executor.attention as _A
_A._use_padded = lambda padded, q: True if padded is None else padded
from executor.train import train

def load(path, sets):
    d = yaml.safe_load(open(path))
    for s in sets:
        k, v = s.split("=", 1)
        cur = d
        ks = k.split(".")
        for kk in ks[:-1]:
            cur = cur[kk]
        cur[ks[-1]] = yaml.safe_load(v)
    return Scenario.model_validate(d)

path, steps, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sets = sys.argv[4:]
sc = load(path, sets)
t0 = time.time()
rec = train(sc, steps=steps, profile_steps=0, log=lambda s: None)
L = [s.loss for s in rec.steps]
m = rec.metrics
import math
tasks = sc.model.tasks.names
row = dict(tag=tag, step0=L[0], step1=L[1], max=max(L), argmax=L.index(max(L)), final=sum(L[-10:])/10,
           auc=[round(m[f"auc_{t}"],4) for t in tasks], ne=[round(m[f"ne_{t}"],4) for t in tasks], eval_loss=m["loss"], s=time.time()-t0)
print("ROW", json.dumps(row))
print("LOSS", " ".join(f"{x:.3f}" for x in L))
with open("/tmp/tq/proxy/results.jsonl", "a") as f:
    f.write(json.dumps(dict(row, losses=L, sets=sets, path=path)) + "\n")
