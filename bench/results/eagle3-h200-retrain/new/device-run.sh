#!/bin/bash
# device call 4: the head retrained on the 24 shards, as many steps as fit B seconds
export PYTHONUNBUFFERED=1
T0=$(date +%s)
SHA=a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .devpay2/gguf-0.19.0-py3-none-any.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
P1=/tmp/p/gguf.part1; [ -f $P1 ] || P1=.devpay1/gguf.part1
cat $P1 .devpay2/gguf.part2 > /tmp/m.gguf
sha256sum /tmp/m.gguf | grep -q b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad gguf"; exit 1; }
nvidia-smi -L; python3 -m workshop.eagle3_train --gguf /tmp/m.gguf --target-sha256 $SHA --device ${DEV:-cuda} --threads 8 \
  --epochs ${EPOCHS:-60} --budget-s ${B:-420} --out /tmp/head ${LIMIT:+--limit $LIMIT} > $OUT/train.log 2>&1
echo "train rc $? after $(( $(date +%s) - T0 )) s"; grep -vi warn $OUT/train.log | tail -16
[ -f /tmp/head/model.safetensors ] && (cd /tmp/head && tar cf - . | split -b 12M - $OUT/head.tar.)
ls -la $OUT
