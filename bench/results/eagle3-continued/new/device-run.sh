#!/bin/bash
# device call 2: second turns for the head's data, then the committed head trained on, on all shards
export PYTHONUNBUFFERED=1
T0=$(date +%s); END=$((T0 + ${TOTAL:-545}))
SHA=a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd
D=.devpay2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $D/gguf-0.19.0-py3-none-any.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
[ -f /tmp/p/a ] || { echo "part a missing: the machine is not call 1's"; exit 3; }
cat /tmp/p/a $D/b > /tmp/m.gguf
sha256sum /tmp/m.gguf | grep -q b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad gguf"; exit 1; }
mkdir -p /tmp/tok /tmp/init && tar xJf $D/tok.tar.xz -C /tmp/tok && tar xJf $D/head.tar.xz -C /tmp/init || exit 1
sha256sum /tmp/init/model.safetensors
nvidia-smi -L
timeout ${GEN_HARD:-220} python3 -m workshop.magpie_data --gguf /tmp/m.gguf --tokenizer /tmp/tok --target-sha256 $SHA \
  --context $D/ctx.json --device cuda --batch ${BATCH:-1024} --second-turns --tokens 1000000000 \
  --budget-s ${GEN:-150} ${NSH:+--shards $NSH} > $OUT/magpie.log 2>&1
echo "magpie rc $? after $(( $(date +%s) - T0 )) s"; grep "^\[magpie\] shard-" $OUT/magpie.log | tail -3
(cd workshop/data/eagle3-smollm2 && tar cJf $OUT/data.tar.xz index.json $(ls shard-* | awk -F'[-.]' '$2>=24'))
ls -la $OUT/data.tar.xz
LEFT=$((END - $(date +%s)))
B=$((LEFT - ${RESERVE:-130}))
echo "train: $LEFT s left, budget $B s"
timeout $((LEFT - 15)) python3 -m workshop.eagle3_train --gguf /tmp/m.gguf --target-sha256 $SHA --device cuda --threads 8 \
  --init /tmp/init --set lr=${LR:-0.0003} --set max_len=1024 --epochs 60 --budget-s $B --out /tmp/head \
  ${LIMIT:+--limit $LIMIT} > $OUT/train.log 2>&1
echo "train rc $? after $(( $(date +%s) - T0 )) s"; grep -vi warn $OUT/train.log | tail -12
[ -f /tmp/head/model.safetensors ] && (cd /tmp/head && tar cf $OUT/head.tar .)
ls -la $OUT
