# Well-specified model class on the same data: per table EmbeddingBag(mean, 8) summed + dense linear -> tanh -> linear.
import os, sys, torch; torch.set_num_threads(1)
args=sys.argv[1:]; sys.argv=[0]
exec(open("proxy/run.py").read().split("path, steps")[0])
sc = load(os.environ.get("SC","proxy/proxy.yaml"), [])
steps=int(os.environ.get("STEPS","60")); lr=float(os.environ.get("LR","0.1"))
from executor.data import SyntheticData, HIDDEN_ROWS
from executor.metrics import auc, normalized_entropy
torch.manual_seed(0)
fams=[(n,f) for f in sc.model.embeddings.pooled for n in f.table_names()]
embs=torch.nn.ModuleDict({n:torch.nn.EmbeddingBag(f.rows,8,mode="mean") for n,f in fams})
for e in embs.values(): torch.nn.init.normal_(e.weight, std=0.01)
dense=torch.nn.Linear(sc.model.dense_features,8); out=torch.nn.Linear(8,2)
params=list(embs.parameters())+list(dense.parameters())+list(out.parameters())
opt=torch.optim.Adagrad(params, lr=lr)
def fwd(b):
    f=dense(b.dense)
    for n,_ in fams:
        v,o=b.pooled[n]; f=f+embs[n](v,o[:-1])
    return out(torch.tanh(f))
d=SyntheticData(sc,0)
for s in range(steps):
    b=next(d); lo=fwd(b); l=torch.nn.functional.binary_cross_entropy_with_logits(lo,b.labels)
    opt.zero_grad(); l.backward(); opt.step()
    if s%10==0: print(s, l.item())
e=SyntheticData(sc,0,split="eval"); L=[];Y=[]
with torch.no_grad():
    for _ in range(8): b=next(e); L.append(fwd(b)); Y.append(b.labels)
L=torch.cat(L);Y=torch.cat(Y)
print("oracle-class", steps, lr, [round(auc(L[:,i],Y[:,i]),4) for i in range(2)], [round(normalized_entropy(L[:,i],Y[:,i]),4) for i in range(2)])
