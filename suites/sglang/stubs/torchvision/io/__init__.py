"""Import-time stand-in: sglang 0.5.20 and earlier import `torchvision.io.decode_jpeg` in sglang.srt.utils.common
(image inputs); nothing the `sglang` tests call decodes an image."""


def decode_jpeg(*args, **kwargs):
    raise RuntimeError("torchvision.io.decode_jpeg is suites/sglang/stubs' import-time stand-in (no torchvision installed)")
