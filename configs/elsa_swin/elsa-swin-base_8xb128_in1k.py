# ELSA-Swin-B, ImageNet-1k, 224x224, 300 epochs (published: 84.0 top-1):
# the ELSA-Swin-T recipe with drop-path 0.5 and the model EMA of the
# official run (timm's --model-ema, decay 0.9998).
_base_ = './elsa-swin-tiny_8xb128_in1k.py'

model = dict(
    backbone=dict(arch='base', drop_path_rate=0.5), head=dict(in_channels=1024)
)
custom_hooks = [dict(type='EMAHook', momentum=2e-4, priority='ABOVE_NORMAL')]
