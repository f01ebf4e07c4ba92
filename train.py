"""Train a SimCSE sentence encoder; the code is simcse_hn/cli/train.py (installed: the `simcse-hn-train` command).

python train.py --config configs/debug_tiny.yaml
accelerate launch train.py --config configs/unsup_bert_base_hcl.yaml --hcl_beta 0.2

Run as a program it enters through simcse_hn/cli/front.py, which answers --help and a bad flag, value or file before
torch is imported; `import train` gives main and run.
"""

if __name__ == "__main__":
    from simcse_hn.cli.front import train

    train()
else:
    from simcse_hn.cli.train import console, main, run  # noqa: F401  (`import train`: main and run)
