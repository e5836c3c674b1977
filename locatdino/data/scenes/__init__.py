"""The built-in synthetic scenes (``render.py``) and their textures (``textures.py``): the
default data set, no download needed."""

from locatdino.data.scenes.render import (
    SCENE_CLASSES,
    ScenesSegmentation,
    render_scene,
    scene_class,
    scene_classes,
    scene_rng,
)

__all__ = ["SCENE_CLASSES", "ScenesSegmentation", "render_scene", "scene_class", "scene_classes", "scene_rng"]
