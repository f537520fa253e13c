"""Optimizers torch lacks, written out as references for the tests: LAMB (models/bert.net's,
rt_recipe.h's lamb) for recipe_crosscheck.py and bert_crosscheck.py, and LARS (rt_recipe.h's
lars, MLPerf ResNet-50's) for recipe_crosscheck.py."""
import torch


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019) as apex's FusedLAMB with its defaults (bias correction, decoupled
    weight decay, grad averaging): per tensor, u = m_hat / (sqrt(v_hat) + eps) + wd * p and
    p -= lr * (||p|| / ||u||) * u, the ratio 1 when either norm is 0 or the group has
    adapt=False (MLPerf BERT's exclude_from_layer_adaptation: the biases and norms)."""

    def __init__(self, groups, lr, betas, eps):
        super().__init__(groups, dict(lr=lr, betas=betas, eps=eps, weight_decay=0.0, adapt=True))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st["t"], st["m"], st["v"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                st["t"] += 1
                g, m, v = p.grad, st["m"], st["v"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                u = (m / (1 - b1 ** st["t"])) / ((v / (1 - b2 ** st["t"])).sqrt() + group["eps"])
                u += group["weight_decay"] * p
                pn, un = float(p.norm()), float(u.norm())
                ratio = pn / un if group["adapt"] and pn > 0 and un > 0 else 1.0
                p.sub_(group["lr"] * ratio * u)


class Lars(torch.optim.Optimizer):
    """LARS (You, Gitman and Ginsburg 2017) as the MLPerf ResNet-50 reference's LARS optimizer: per
    tensor, ratio = eta * ||p|| / (||g|| + wd * ||p|| + eps) of the raw gradient g (1 when either
    norm is 0, or the group has adapt=False: the reference's skip_list, also without weight
    decay), then v = momentum * v + lr * ratio * (g + wd * p) from v = 0, and p -= v."""

    def __init__(self, groups, lr, momentum, eta, eps=0.0):
        super().__init__(groups, dict(lr=lr, momentum=momentum, eta=eta, eps=eps, weight_decay=0.0, adapt=True))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            wd = group["weight_decay"]
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st["v"] = torch.zeros_like(p)
                g = p.grad
                pn, gn = float(p.norm()), float(g.norm())
                ratio = group["eta"] * pn / (gn + wd * pn + group["eps"]) if group["adapt"] and pn > 0 and gn > 0 \
                    else 1.0
                st["v"].mul_(group["momentum"]).add_(g + wd * p, alpha=group["lr"] * ratio)
                p.sub_(st["v"])
