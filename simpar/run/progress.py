"""The training loop's progress bar and epoch lines (rank 0 only)."""

from __future__ import annotations

from .. import console


class Progress:
    """A tqdm bar on rank 0 (nothing elsewhere, nothing under --quiet)."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="train", unit="step", leave=False, dynamic_ncols=True)
            console.show_bar(self.bar)  # any error line clears it first (console.say)

    def update(self, loss: float) -> None:
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            self.bar.update(1)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
