"""The translation workbench: data selection and evaluation (:mod:`.evaluation`), the main job
(``attnkit demo``, :mod:`.demo`) and its report (:mod:`.report`)."""

from ..training.setup import build_tokenizers
from .demo import DEMO_EPOCHS, DEMO_MODEL, DEMO_MODELS, DEMO_RECIPE, FIGURE2_EPOCHS, FIGURE2_MODELS, run_demo
from .evaluation import evaluate_model, load_split, plot_alignment, quality_against_length

__all__ = ["load_split", "build_tokenizers", "evaluate_model", "quality_against_length", "run_demo",
           "plot_alignment", "DEMO_MODELS", "FIGURE2_MODELS", "DEMO_EPOCHS", "FIGURE2_EPOCHS", "DEMO_RECIPE", "DEMO_MODEL"]
