"""Import-time stand-in for torchvision in the CPU SGLang oracle environment.

sglang 0.5.23 imports `torchvision.transforms` (InterpolationMode) while importing its
memory pools (via configs -> multimodal.internvl_utils), 0.5.20 and earlier also
`torchvision.io` (decode_jpeg, in sglang.srt.utils.common); the package index's torchvision
wheels need a CUDA torch. Nothing the `sglang` tests call uses torchvision.
"""
