"""Recall vs budget per method, one panel per data set (PNG, matplotlib)."""
import matplotlib

matplotlib.use("Agg")  # no display on build machines
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {"oracle": ("k", "-"), "random": ("0.6", ":"), "sinks+recent": ("tab:brown", "--"),
         "plan": ("tab:green", "--"), "quest": ("tab:blue", "-"), "hybrid": ("tab:orange", "-"),
         "plan+quest": ("tab:purple", "-"), "plan+hybrid": ("tab:pink", "-"), "keys": ("tab:cyan", "-"),
         "plan+keys": ("tab:gray", "-"), "adaptive-0.9": ("tab:red", "-."),
         "adaptive-0.95": ("tab:olive", "-.")}


def recall_vs_budget(summaries, path):
    """summaries: {data: {(method, budget): stats}} as run_quality builds it."""
    names = list(summaries)
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.8), squeeze=False)
    for ax, name in zip(axes[0], names):
        methods = sorted({m for m, b in summaries[name] if m != "dense"}, key=lambda m: list(STYLE).index(m)
                         if m in STYLE else 99)
        for m in methods:
            pts = sorted((b, s["recall_mean"], s["recall_p5"]) for (mm, b), s in summaries[name].items() if mm == m)
            color, ls = STYLE.get(m, (None, "-"))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, color=color, marker="o", ms=3, label=m)
            ax.plot([p[0] for p in pts], [p[2] for p in pts], ls, color=color, alpha=0.3, lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks([0.0625, 0.125, 0.25, 0.5])
        ax.set_xticklabels(["6.25%", "12.5%", "25%", "50%"])
        ax.set_ylim(0, 1.02)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("token budget (share of context)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("attention-mass recall (mean; faint: p5)")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
