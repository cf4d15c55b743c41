# The headline experiment: Faster R-CNN with RedNet-50-FPN, 1x schedule, COCO
# 2017, as published (39.5 box AP). Train with
#   python tools/train.py configs/rednet50_fpn_coco.py
#   bash tools/dist_train.sh configs/rednet50_fpn_coco.py 8
_base_ = './rednet/faster-rcnn_rednet50_fpn_1x_coco.py'
