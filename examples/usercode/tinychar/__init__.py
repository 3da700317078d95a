"""tinychar: a tiny character-level language model and its data, as plain Lightning classes.

Nothing here knows about jobgen: the spec names the classes (``tinychar.CharModel``,
``tinychar.CharDataModule``) and jobgen owns the launch and the Trainer.
"""

from tinychar.data import CharDataModule
from tinychar.model import Block, CharModel

__all__ = ["Block", "CharDataModule", "CharModel"]
