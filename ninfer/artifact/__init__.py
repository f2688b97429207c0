"""The v3 `.ninfer` artifact: format, storage formats, converters."""

from ninfer.artifact.format import Artifact, ArtifactWriter, StoredTensor, TensorInfo

__all__ = ["Artifact", "ArtifactWriter", "StoredTensor", "TensorInfo"]
