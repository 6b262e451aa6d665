import os, time, sys, copy
import torch; torch.set_num_threads(1)
args=sys.argv[1:]; sys.argv=[0]
exec(open("proxy/run.py").read().split("path, steps")[0])
sc = load(os.environ.get("SC","proxy/proxy.yaml"), args)
from executor.data import SyntheticData
from executor.model import build_model, compute_loss
from executor.train import _optimizers, _step_loss, _Warmup
d=SyntheticData(sc,0); b0=next(d); b1=next(d)
for b in (b0,b1): b.validate(sc.model)
m=build_model(sc)
dense_opt, sparse_opt = _optimizers(m, sc)
w=_Warmup(dense_opt, sc.training.dense_lr, sc.training.lr_warmup_steps, None); w.set(0)
init = copy.deepcopy(m.state_dict())
with torch.no_grad(): lo0,_ = m(b1); print("init loss on b1", compute_loss(lo0,b1.labels).item(), "logit std", lo0.std().item())
l = _step_loss(m, [b0], dense_opt, sparse_opt, grad_clip=sc.training.grad_clip)
after = copy.deepcopy(m.state_dict())
with torch.no_grad(): lo1,_ = m(b1); print("after loss on b1", compute_loss(lo1,b1.labels).item(), "logit std", lo1.std().item(), "mean", lo1.mean(0).tolist())
def grp(k):
    if "tables" in k: return "embeddings"
    for p in ("bottom","family_proj","groups","W_in","seq_layers","nonseq_layers","cross_layers","top","heads"):
        if k.startswith(p): return p
    return k
groups = sorted(set(grp(k) for k in init))
for g in groups:
    sd = {k:(after[k] if grp(k)==g else init[k]) for k in init}
    m.load_state_dict(sd)
    with torch.no_grad(): lo,_ = m(b1)
    print(f"only {g:14s} updated: loss {compute_loss(lo,b1.labels).item():.3f} dlogit rms {(lo-lo0).pow(2).mean().sqrt().item():.3f}")
m.load_state_dict(after)
acts={}
top = m.top
lin = [i for i,l in enumerate(top) if isinstance(l, torch.nn.ReLU)]
for i in lin: top[i].register_forward_hook(lambda mod,inp,out,i=i: acts.__setitem__(i,out))
with torch.no_grad(): m(b1)
for i,o in acts.items(): print(f"after step: top relu {i}: dead units (0 for all samples) {(o.amax(0)==0).float().mean().item():.3f}, active frac {(o>0).float().mean().item():.3f}")
m.load_state_dict(init); acts.clear()
with torch.no_grad(): m(b1)
for i,o in acts.items(): print(f"init: top relu {i}: dead {(o.amax(0)==0).float().mean().item():.3f}, active frac {(o>0).float().mean().item():.3f}")
