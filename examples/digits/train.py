"""Train a small classifier on a dataset that ships inside scikit-learn.

Real data, no download: the handwritten digits dataset (1,797 8x8 images,
bundled with scikit-learn). An SGD logistic-regression model is trained for a
few epochs with a progress line per epoch, then evaluated on a held-out split.

Under jobsup it also reports its progress and metrics through the file
``$JOBSUP_PROGRESS_FILE`` (one JSON object, replaced after each epoch):
``jobsup runs`` shows them, and ``jobsup runs --sweep S`` compares the runs
of a sweep (examples/digits/sweep.yaml).
Under jobsup the trained model (scaler and classifier, pickled) goes to
``$JOBSUP_OUTPUT_DIR/model.pkl``: the run's outputs folder, which jobsup
lists with each file's sha256 when the run ends (`jobsup outputs RUN`,
`jobsup which model.pkl`).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time
from typing import Any


def main() -> int:
    # Here, not at the top: save_model and report work (and are tested)
    # without scikit-learn.
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.linear_model import SGDClassifier
    from sklearn.metrics import accuracy_score
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alpha", type=float, default=1e-4, help="L2 regularisation strength")
    args = parser.parse_args()

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data, digits.target, test_size=0.25, random_state=args.seed, stratify=digits.target
    )
    scaler = StandardScaler().fit(x_train)
    x_train, x_test = scaler.transform(x_train), scaler.transform(x_test)
    classes = np.unique(digits.target)
    model = SGDClassifier(loss="log_loss", alpha=args.alpha, random_state=args.seed)
    rng = np.random.default_rng(args.seed)
    print(f"digits: {len(x_train)} train / {len(x_test)} test images, {len(classes)} classes", flush=True)
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(x_train))
        for start in range(0, len(order), 64):
            batch = order[start : start + 64]
            model.partial_fit(x_train[batch], y_train[batch], classes=classes)
        train_acc = accuracy_score(y_train, model.predict(x_train))
        print(f"epoch {epoch:2d}/{args.epochs}  train accuracy {train_acc:.3f}", flush=True)
        report(epoch, args.epochs, {"train_acc": round(float(train_acc), 4)})
        time.sleep(0.2)
    test_acc = accuracy_score(y_test, model.predict(x_test))
    print(f"test accuracy {test_acc:.3f}", flush=True)
    report(args.epochs, args.epochs, {"train_acc": round(float(train_acc), 4), "test_acc": round(float(test_acc), 4)})
    path = save_model({"scaler": scaler, "model": model, "test_accuracy": test_acc})
    if path:
        print(f"model written to {path}", flush=True)
    if test_acc < 0.8:
        print("accuracy below 0.8: something is wrong", file=sys.stderr)
        return 1
    return 0


def save_model(model: Any) -> str | None:
    """Pickle ``model`` to ``$JOBSUP_OUTPUT_DIR/model.pkl`` (the run's
    outputs folder, when run by jobsup) and return that path; None when
    not run by jobsup (nothing written)."""
    out_dir = os.environ.get("JOBSUP_OUTPUT_DIR")
    if not out_dir:
        return None
    path = os.path.join(out_dir, "model.pkl")
    with open(path, "wb") as f:
        pickle.dump(model, f)
    return path


def report(step: int, total: int, metrics: dict[str, float]) -> None:
    """Replace the progress file's content (when run by jobsup): a write
    to a temporary file, then a rename, so it is never read half-written."""
    path = os.environ.get("JOBSUP_PROGRESS_FILE")
    if not path:
        return
    with open(path + ".tmp", "w") as f:
        json.dump({"step": step, "total": total, "metrics": metrics}, f)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
