#!/usr/bin/env bash
# The H100 check of a tree (docs/conformance.md, "How the H100 runs were made"): run on the device machine from
# the repository root, with the wheels of this tree and their missing dependencies in .whl/ and the Vulkan
# loader's .debs in .gl/ (both carried). Writes logs and report tarballs under $OUT (or ./device-out).
set -uo pipefail
OUT="${OUT:-$PWD/device-out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python3 -m tilecore targets list 2>&1 | tee -a "$OUT/device.txt"
# STEPS="device-tests host ..." runs only the steps named (all when unset)
# D86 retired the WGMMA register program (sm_90a): the 72 steps that measured it or its options went with it
# (conformance-schedules, attention-schedules / -softmax / -lean, fa680, fa3pp, causal*, genfa*, fagen-* but
# fagen-confirm-tests / fagen-auto, fa66-*-1/2, fa66b-*, fa66c-*, fa66d-*, faroute-*, fa90last / -d256 / -176 / -d64 /
# -prof, fa90r2*, fa90r3, faauto-r2 / -r3, fa90d64 / -mix / -ca / -prof / -bound* / -r2 / -r3 / -fast, fa90d256 /
# -more / -r2, fa90x176*); their numbers are in docs/decisions.md (D28-D83). The mma.sync program's steps (sm80*, sm86*,
# mma*) stay; fa86 / fa86-tests measure the general path that took every form
want() { [ -z "${STEPS:-}" ] || [[ " $STEPS " == *" $1 "* ]]; }
step() { local name=$1; shift; want "$name" || return 0; local t0=$SECONDS; "$@" > "$OUT/$name.log" 2>&1; local rc=$?
         echo "$name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"; tail -n 15 "$OUT/$name.log"; }
step conformance-cuda python3 -m tilecore conformance run --target cuda:sm_90a -n 8 --report /tmp/rep/cuda
# every kernel on the core's general path (no register programs / Hopper pipelines): wgmma through the core model
step conformance-general env TILECORE_PASS_CONFIGS='{"tilecore.cuda.register_programs": false}' \
     python3 -m tilecore conformance run --target cuda:sm_90a -n 8 --report /tmp/rep/cuda-general
# the catalog's attention cases with FA3's schedules on (decision D28; off is the default the step above ran)
step wgmma-tests python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_wgmma_unit.py -rs
# the persistent tile loop (D36) on every catalog kernel of its form: 2 blocks loop over the tiles, the pipeline
# carried across them, on the general path
step conformance-persistent env TILECORE_PASS_CONFIGS='{"tilecore.cuda.register_programs": false, "tilecore.persistent": 2}' \
     python3 -m tilecore conformance run --target cuda:sm_90a -n 8 --report /tmp/rep/cuda-persistent
step persistent-tests python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_persistent.py -rs
step conformance-webgpu python3 -m tilecore conformance run --target webgpu -n 4 --report /tmp/rep/webgpu
# fragments' row reductions through subgroup shuffles on the NVIDIA Vulkan adapter (subgroups of 32; decision D21)
step webgpu-subgroups python3 scripts/webgpu_subgroup_probe.py
step webgpu-shuffles python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_webgpu_shuffles.py \
     tests/test_layout_inference.py -k "webgpu and not cuda"
step webgpu-rows python3 benchmarks/webgpu_row_reductions.py --rep 50 --rows 16384 --cols 1024
step device-tests python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_backend.py tests/test_cuda_tensor_cores.py \
     tests/test_cuda_hopper.py tests/test_guards.py tests/test_regressions.py tests/test_layout_inference.py \
     tests/test_pipeline_planner.py tests/test_matrix_gemm.py tests/test_cuda_units.py tests/test_cuda_wgmma_unit.py tests/test_indexed_shuffles.py \
     tests/test_cuda_attention_softmax.py tests/test_cuda_splitk.py tests/test_c_launcher.py \
     tests/test_cuda_persistent.py tests/test_cuda_attention_lean.py tests/test_dynamic_tma.py tests/test_copy_groups.py \
     tests/test_cuda_attention_critical_path.py \
     tests/test_cuda_tma_store.py tests/test_cuda_mcast.py tests/test_general_gemm.py tests/test_persistent.py \
     tests/test_cuda_swizzle64.py tests/test_vectorize_copies.py tests/test_cuda_clusters_at_once.py \
     tests/test_cuda_streamk.py tests/test_cuda_general_attention.py tests/test_block_order.py tests/test_cuda_exp2_rows.py \
     tests/test_cuda_exp2_poly.py tests/test_cuda_row_division.py tests/test_gemm_kstep.py \
     tests/test_host_launch.py tests/test_general_fp8.py tests/test_cuda_fa_parity.py tests/test_cuda_fa_unswitch.py \
     tests/test_general_splitk.py tests/test_programmatic_launch.py tests/test_mma_route.py tests/test_cuda_fa_loops.py tests/test_mma_route_sm86.py \
     tests/test_group_multicast.py tests/test_cuda_fa_d64.py tests/test_cuda_fa_scale_turn.py tests/test_uniform_fragments.py
# the CUDA plugin's Hopper GEMM pipeline on a persistent grid (decision D34; the core's tilecore.persistent is D36): off, on and ping-pong, every configuration, one run;
# the catalog's GEMMs with it on
step hopper-persistent python3 benchmarks/cuda_gemm.py --rep 10 --sizes "${GEMM_SIZES:-4096,8192}" --no-fp8 --triton \
     --persistent off,on,pingpong
step conformance-hopper-persistent python3 -m tilecore conformance run --target cuda:sm_90a -n 8 -k gemm \
     --pass-config tilecore.cuda.persistent=true --report /tmp/rep/cuda-hopper-persistent
step gemm python3 benchmarks/cuda_gemm.py --rep 10 --sizes "${GEMM_SIZES:-4096,8192}" --no-fp8 --triton \
     --shapes "${GEMM_SHAPES:-4096x4096x14336,4096x14336x4096,128x4096x4096,16x8192x8192}"
# issue 11's table also has fp8 8192^3 (float8_e4m3, B as (N, K)) against torch._scaled_mm (cuBLAS fp8)
# GEMM under the power cap (issue 17): TFLOP/s, SM clock, power and FLOP per SM-cycle against cuBLAS (~2 min)
step gemm-power python3 benchmarks/gemm_power.py --triton --seconds 4
step gemm-fp8 python3 benchmarks/cuda_gemm.py --rep 10 --sizes "" --dtypes ""
# D67 (issue 11): the fp8 GEMM on the core's general path (B as (N, K): TMA of both operands, wgmma m64nNk32 reading
# them K-major). fp8gen-tests: the device tests (float64, bit for bit the direct stores and the routed build; e4m3 and
# e5m2, ragged M / N / K, the three tiles). fp8gen: e4m3 4096^3 and 8192^3 at the benchmark's tiles (128x256x128/3 and
# /4, 128x128x128/4, panel 8), one process, each tile's kernels timed in turn 3 rounds (medians): the plugin's pipeline
# (fp8's default), the general path's direct stores (plain), its default (bulk store, persistent, D62's us), D58's
# form (us off), the routed build (general_plain_gemm=true through the plugin's passes); cuBLAS (torch._scaled_mm)
# beside (~3 min). fp8gen-e5m2: the same for e5m2 (no cuBLAS: it has no e5m2 x e5m2 GEMM), default and routed (~2 min)
step fp8gen-tests timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_general_fp8.py -rs
step fp8gen timeout 230 python3 benchmarks/general_gemm.py --rep 20 --rounds 3 --sizes 4096,8192 --dtypes float8_e4m3 \
       --configs 128:256:128:256:3:8,128:256:128:256:4:8,128:128:128:256:4:8 --variants plain,default,d58,routed
# D67 round 2: e4m3 again, 5 rounds, with the routing's "auto" rule (8-bit taken since D67); then the performance
# table's fp8 row (benchmarks/cuda_gemm.py, best of FP8_CONFIGS against torch._scaled_mm) with the plugin (default)
# and routed under "auto" (~3.5 min)
step fp8gen-r2 bash -c 'rc=0; timeout 120 python3 benchmarks/general_gemm.py --rep 20 --rounds 5 --sizes 4096,8192 \
       --dtypes float8_e4m3 --configs 128:256:128:256:3:8,128:256:128:256:4:8,128:128:128:256:4:8 \
       --variants default,routed-auto || rc=$?;
     timeout 60 python3 benchmarks/cuda_gemm.py --rep 20 --sizes "" --dtypes "" || rc=$?;
     TILECORE_PASS_CONFIGS="{\"tilecore.cuda.general_plain_gemm\": \"auto\"}" timeout 60 python3 benchmarks/cuda_gemm.py \
       --rep 20 --sizes "" --dtypes "" || rc=$?; exit $rc'
# D67 round 3, the bar (>= 0.97x the plugin): e4m3 and e5m2, 4096^3 and 8192^3, the three tiles, one process, each
# tile's kernels timed in turn 9 rounds (medians and ranges: the 0.1 ms rows ran bimodal, 0.093 or 0.104 ms, for both
# kernels in rounds 1-2): the plugin, the general default, routed under "auto" (~2.5 min)
step fp8gen-bar timeout 230 python3 benchmarks/general_gemm.py --rep 30 --rounds 9 --sizes 4096,8192 \
       --dtypes float8_e4m3,float8_e5m2 --configs 128:256:128:256:3:8,128:256:128:256:4:8,128:128:128:256:4:8 \
       --variants default,routed-auto
step fp8gen-e5m2 timeout 200 python3 benchmarks/general_gemm.py --rep 20 --rounds 3 --sizes 4096,8192 --dtypes float8_e5m2 \
       --configs 128:256:128:256:3:8,128:256:128:256:4:8,128:128:128:256:4:8 --variants default,routed
# D67 item 2: the LLM rows (128x4096x4096, 16x8192x8192, fp16) with the general path beside the plugin's split-K: cuBLAS,
# the plugin (default: split, cluster sum; split_k=1; the global sum), the general path unsplit (it has no split-K),
# the user's atomic split-K kernel (a grid dimension over K, float32 atomics into a zeroed C) on the plugin and on the
# general path; 10 rounds x 10 calls interleaved, medians (~3 min)
step fp8gen-splitk timeout 230 python3 benchmarks/cuda_gemm_splitk.py --general --rounds 10 --batch 10 \
       --configs 64:128:64:128:4,64:256:64:128:3,128:128:64:256:5
# D69: split-K on the core's general path (tilecore.split_k) against the plugin's split-K (cluster sum = its default,
# and its workspace sum) and cuBLAS, the LLM rows and few-tile shapes, one process, interleaved rounds; then the
# device tests of tests/test_general_splitk.py (float64, bit for bit across calls and streams) (< 3 min)
step splitkgen bash -c 'rc=0; timeout 140 python3 benchmarks/general_splitk.py --rounds 6 --batch 10 \
       --shapes 128x4096x4096,16x8192x8192,256x4096x4096,32x4096x14336 --splits 2,4,8 || rc=$?; \
     timeout 40 python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_general_splitk.py -k "on_gpu or routed" -rs || rc=$?; exit $rc'
# D75: split-K summed in a block group (tilecore.split_k_reduce="group": the tile's splits one thread-block cluster,
# ranks 1..S-1 store their registers into rank 0's block memory) against the workspace sum, the plugin's cluster sum
# and cuBLAS, 128x4096x4096 and 16x8192x8192 fp16, interleaved in both orders; then the device tests (float64, the
# workspace form's bits)
step blockgroup bash -c 'rc=0; timeout 160 python3 benchmarks/general_splitk_group.py --rounds 6 --batch 10 \
       --shapes 128x4096x4096,16x8192x8192 --splits 2,4 --tiles 128x128x64/256/4,64x128x64/128/4 || rc=$?; \
     timeout 60 python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_general_splitk.py -k "group and on_gpu" -rs || rc=$?; exit $rc'
# D75 round 2: the routing rows: at the plugin's tile and at 64x128 / 128x64 tiles, the plugin against the same kernel
# routed to the core (tilecore.cuda.general_split_k="group"), the core's workspace / group sums at 2 splits, the LLM
# rows, 10 rounds in both orders; then the group device tests
step blockgroup-r2 bash -c 'rc=0; timeout 160 python3 benchmarks/general_splitk_group.py --focus --rounds 10 --batch 10 \
       --shapes 128x4096x4096,16x8192x8192,256x4096x4096,32x4096x14336 --tiles 64x128x64/128/4,128x64x64/256/4 || rc=$?; \
     timeout 60 python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_general_splitk.py tests/test_block_group.py -k "group and on_gpu" -rs || rc=$?; exit $rc'
# D78: split-K's 3 splits of the plugin's default tiles (128x128/5 at 128x4096x4096, 64x256 at 16x8192x8192 and, every
# row valid, 64x8192x8192, 128x128/4 at 32x4096x14336) summed in cells (rows x one panel; the area beside the stages,
# with the staging tile over it, or over the stages) against the plugin's cluster sum, its workspace sum, the core's
# workspace and slices sums at the same tile and count, the routed kernels and cuBLAS, 10 rounds in both orders; then
# the cells device tests (float64, bit for bit, the workspace kernel's bits, the routed kernels). splitk3-b: a second
# run, the shapes in the other order
step splitk3 bash -c 'rc=0; timeout 150 python3 benchmarks/general_splitk_group.py --cells --rounds 10 --batch 10 \
       --shapes 128x4096x4096,16x8192x8192,64x8192x8192,32x4096x14336 || rc=$?; \
     timeout 80 python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_general_splitk.py -k "cells and on_gpu" -rs || rc=$?; exit $rc'
step splitk3-b timeout 170 python3 benchmarks/general_splitk_group.py --cells --rounds 10 --batch 10 \
       --shapes 32x4096x14336,64x8192x8192,16x8192x8192,128x4096x4096
# D78 round 3: the LLM rows alone, 20 rounds in both orders, twice (the shapes' order reversed): the routed default
# (since round 2 also 128x128x64/5, the staging tile over the cells' area) against the plugin at its tile
step splitk3-c bash -c 'rc=0; for sh in 128x4096x4096,16x8192x8192 16x8192x8192,128x4096x4096; do \
       timeout 110 python3 benchmarks/general_splitk_group.py --cells --rounds 20 --batch 10 --shapes $sh || rc=$?; done; exit $rc'
# D84: the plugin's split GEMMs with 8-bit operands or a 32-bit C (WIDE: fp8 128x128x128/4, 64x256x128/3,
# 64x128x128/4; fp16 into fp32 C 64x128x64/4, 128x128x64/3, /5) against the same GEMMs routed to the core's group
# sum by tilecore.cuda.general_split_k_8bit / _c32, torch.matmul / torch._scaled_mm in the same run, 10 rounds in both
# orders (20 since round 2), then the shapes in the other order
step splitk4 bash -c 'rc=0; for sh in 128x4096x4096,16x8192x8192 16x8192x8192,128x4096x4096; do \
       timeout 80 python3 benchmarks/general_splitk_group.py --wide --rounds 20 --batch 10 --shapes $sh || rc=$?; done; exit $rc'
# D84 round 4: the 8-bit rows at 16x8192x8192 alone (panels against cells where C's 16 rows fill an eighth of a
# 128-row tile), 30 rounds in both orders, twice
step splitk4-r4 bash -c 'rc=0; for r in 1 2; do timeout 60 python3 benchmarks/general_splitk_group.py --wide \
       --wide-rows float8_e4m3 --rounds 30 --batch 10 --shapes 16x8192x8192 || rc=$?; done; exit $rc'
# D84's device tests: the routed 8-bit / 32-bit-C split GEMMs and the cells (with the ragged-N cells past C's columns
# not exchanged) against float64, bit for bit, the workspace kernel's bits
step splitk4-tests timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_general_splitk.py \
     -k "(wide or cells or routed) and on_gpu" -rs
step attention python3 benchmarks/cuda_attention.py --rep 3
step attention-fast python3 benchmarks/cuda_attention.py --rep 3 --fast-math
# the softmax's critical path (decision D39): the row maximum as one chain, the defaults (partial chains), the softmax
# beside P @ V (128 x 128 only: 128 x 176 falls back), all of D39 (+ per-thread row sums under fast math), non-causal
# and causal, exact and fast, both blocks (each block's time on stderr), cuDNN in the same run
step attention-d64 python3 benchmarks/cuda_attention.py --rep 3 --dim 64
# TileLang's own forward-attention example: the register program (D33) vs the general path it took before, SDPA beside
step corpus-attention python3 benchmarks/corpus_attention.py --rep 3
step attention-gqa python3 benchmarks/cuda_attention.py --rep 3 --kv-heads 8 --fast-math --blocks 128x128x256x2,128x128x256x3
step attention-d256 python3 benchmarks/cuda_attention.py --rep 3 --dim 256 --blocks 128x64x256x2,64x64x128x2,64x32x128x2,128x32x256x2
step offpath python3 benchmarks/cuda_offpath.py --rep 20
# FlashAttention with every kernel on the core's general path (wgmma through the core model), cuDNN in the same run
step attention-general env TILECORE_PASS_CONFIGS='{"tilecore.cuda.register_programs": false}' \
     python3 benchmarks/cuda_attention.py --rep 3
step matrix-unit python3 benchmarks/matrix_unit_gemm.py
# the persistent tile loop (D36) on and off on the general path, cuBLAS in the same run
step persistent python3 benchmarks/matrix_unit_gemm.py --shapes 4096x4096x4096,8192x8192x8192 --rep 20 \
     --variants "wgmma unit,wgmma persistent" --configs 128x256x64,128x128x64
# layout conversion by indexed shuffles against a shared-memory round trip (decision D24)
step shuffles python3 benchmarks/conversion_shuffles.py --target cuda:sm_90a
step gemm-generic python3 benchmarks/cuda_gemm_generic.py --dtypes float16 --rep 20 --check
step host python3 benchmarks/host_costs.py --profile-compile
# D57: the compiled launcher reading tensors through torch's C shim against torch's getters (D23) and the Python
# binder, in one process beside torch.add (back-to-back and the host's cost alone), then its tests on the GPU. ~45 s
step hostlaunch bash -c 'rc=0; python3 benchmarks/host_costs.py --launch-only --rounds 6 || rc=$?;
     python3 -m pytest -q -p no:cacheprovider tests/test_host_launch.py tests/test_c_launcher.py -rs || rc=$?; exit $rc'
# cold compile of the WGMMA GEMM in fresh processes, NVRTC's cache off (decisions D25, D48): pinned to one CPU, min /
# median / spread, the phases (first launch included) and a cProfile
step cold bash -c "python3 benchmarks/cold_compile.py --repeat ${COLD_REPEAT:-5} --cpus 1 \
     --variants default,per-tile --profile"
# tilecore-musa's warp-32 SIMT subset through nvcc (a proxy smoke test, never MUSA `device` mode; needs its wheel)
step musa-proxy python3 scripts/musa_h100_proxy_smoke.py
step corpus env TILECORE_CORPUS_DEVICE=cuda:sm_90a python3 -m pytest -q -n 8 -p no:cacheprovider \
     tests/test_tilelang_corpus.py -k test_device -rxXf
# few-tile GEMMs (D41): the split-K device tests, then the compiler's split-K with the cluster (DSMEM) sum against the
# global-workspace sum (D27/D31, the kernel before), split_k=1, the user's atomic split-K, cuBLAS and Triton, one run
step streamk bash -c 'python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_splitk.py -k device -rs; r=$?; \
     python3 benchmarks/cuda_gemm_splitk.py --rounds 20 --batch 10 --split-k 2,3,4 && exit $r'
# stream-K for the persistent GEMM's last wave (decision D53): its device tests (float64; stream-K off within float32
# rounding; the flags left at zero), then tilecore.cuda.stream_k off / on / tail / stagger, fp16 and bf16, 4096^3, 8192^3 and the
# LLM shapes (4096,4096,14336), (4096,14336,4096), cuBLAS and Triton in the same run (interleaved rounds); shapes whose
# A and B fit in L2 (K 1024, 2048); first the pipeline profile of each mode (the stream-K pieces' cycles a k step)
step streamk2 bash -c 'rc=0; python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_streamk.py -k device -rs || rc=$?;
     python3 benchmarks/cuda_gemm_streamk.py --rep 20 --rounds 2 --dtypes float16 --profile || rc=$?;
     python3 benchmarks/cuda_gemm_streamk.py --rep 20 --rounds 2 --dtypes bfloat16 \
       --shapes 4096x4096x4096,8192x8192x8192,4096x4096x14336,4096x14336x4096 || rc=$?; exit $rc'
# dynamic-shape GEMMs on TMA (D40): the loop versioned at launch vs the cp.async version alone (versioning off),
# odd K, the static kernel and cuBLAS in the same run, host us per launch; then both versions' float64 device tests
step dyntma bash -c "python3 benchmarks/cuda_gemm_dynamic.py --rep 20 && \
     python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_dynamic_tma.py -rs && \
     python3 -m tilecore conformance run --target cuda:sm_90a -k dynamic"
# TileLang's layernorm and RMSNorm at blk_m = 1 (decision D42: the copies as one async group), torch in the same run;
# with .norms_before/ carried (`python benchmarks/corpus_norms.py --export .norms_before` in the tree before the
# change, no GPU needed) the old tree's kernels are timed beside this tree's
step norms python3 benchmarks/corpus_norms.py --rep 50 --load .norms_before
# the persistent GEMM's epilogue through shared memory and TMA stores (decision D38): its device tests (float64 and the
# direct stores bit for bit), then tma_store off and on for the 128x256 tile at 3 stages (the whole C tile) and 4 (in
# halves) and the 128x128 at 4, cuBLAS beside
step tma-store bash -c 'rc=0; python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_tma_store.py -rs || rc=$?;
     python3 benchmarks/cuda_gemm.py --rep 20 --sizes 4096,8192 --no-fp8 --tma-store off,on \
       --configs 128:256:64:256:3:8,128:256:64:256:4:8,128:128:64:256:4:8 || rc=$?; exit $rc'
# the core's general path on the Hopper GEMM schedule (decisions D46, D51): its device tests (float64, and bit for bit the
# plain general path; the new default with stmatrix included), then the general path plain / the default (the bulk
# store alone, stmatrix into its tile) and the default without stmatrix / persistent + bulk (D46's), beside the plugin's
# Hopper pipeline and cuBLAS, fp16 4096^3 and 8192^3, one process (the catalog with the defaults: general-catalog)
step general-gemm bash -c 'rc=0; python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_general_gemm.py -rs || rc=$?;
     python3 benchmarks/general_gemm.py --rep 40 --sizes 4096,8192 \
       --configs 128:256:64:256:3:8,128:256:64:256:3,128:128:64:256:4 \
       --variants plain,default-stsm-off,default,persistent+bulk || rc=$?; exit $rc'
# the general path's default (decisions D51, D58): the whole catalog with the plain Hopper GEMM routed to the general
# path (tilecore.cuda.general_plain_gemm, the candidate default of D58) and the next tile's indices per tile; then every
# kernel on the general path with every kernel of the persistent form on 2 blocks and every bulk store's tile in 2
# parts (D58's parts wherever they apply); device mode, the summary's PASS count
step general-catalog bash -c 'rc=0;
     python3 -m tilecore conformance run --target cuda:sm_90a -n 12 --report /tmp/rep/cuda-general-routed \
       --pass-config tilecore.cuda.general_plain_gemm=true --pass-config tilecore.persistent_next_indices=per_tile || rc=$?;
     python3 -m tilecore conformance run --target cuda:sm_90a -n 12 --report /tmp/rep/cuda-general-parts \
       --pass-config tilecore.cuda.register_programs=false --pass-config tilecore.persistent=2 \
       --pass-config tilecore.bulk_store_parts=2 || rc=$?;
     for r in cuda-general-routed cuda-general-parts; do python3 -c "import json, sys; m = json.load(open(sys.argv[1]));
print(sys.argv[2], m.get(\"mode\", m.get(\"target\")), m[\"counts\"])" /tmp/rep/$r/manifest.json $r || rc=1; done; exit $rc'
# the general path's GEMM at the plugin's speed (decision D56): the device tests of the general path and the persistent
# loop (float64, bit for bit the plain general path; T.use_swizzle panels whole and ragged), then fp16 and bf16 at
# 4096^3 and 8192^3, 128x256x64/3: with T.use_swizzle(8) the plugin's default (persistent, TMA-store epilogue), the
# general default (bulk store, no persistent loop), persistent + bulk (D56's panel walk), with the next tile's indices
# bound per tile, and with D36's run-time panel rows (the before), ws + persistent + bulk (the last stage released at once) and with D46's release (the before), the
# plain GEMM routed with tilecore.persistent=auto (~2.5 min). genpath-tiles: without the panel (128x256x64/3,
# 128x128x64/4) the plugin, the general default and persistent + bulk; then the plugin's other tiles with panel 8
# (4 stages, 128x128) routed; cuBLAS in the same process (~2 min)
step genpath bash -c 'rc=0; timeout 100 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_general_gemm.py \
       tests/test_persistent.py -k "device or panel" -rs || rc=$?;
     timeout 150 python3 benchmarks/general_gemm.py --rep 40 --sizes 4096,8192 --dtypes float16,bfloat16 \
       --configs 128:256:64:256:3:8 --variants default,persistent+bulk,persistent+bulk-per-tile,persistent+bulk-runtime-rows,ws+persistent+bulk,ws+persistent+bulk-d46-release,routed-persistent-auto || rc=$?; exit $rc'
step genpath-tiles bash -c 'rc=0; timeout 120 python3 benchmarks/general_gemm.py --rep 40 --sizes 4096,8192 --dtypes float16,bfloat16 \
       --configs 128:256:64:256:3,128:128:64:256:4 --variants default,persistent+bulk || rc=$?;
     timeout 90 python3 benchmarks/general_gemm.py --rep 40 --sizes 4096,8192 --dtypes float16 \
       --configs 128:256:64:256:4:8,128:128:64:256:4:8 --variants default,routed-persistent-auto || rc=$?; exit $rc'
# D58 (issue 11): the general path's GEMM at every plugin tile. genpath2: the device tests of the general path and the
# persistent loop (float64, bit for bit the plain general path; the tile stored in parts included), then 128x128x64/4
# panel 8 (the tile still behind the plugin), fp16 and bf16 at 4096^3 and 8192^3: the plugin's default, the general
# default (per_tile by default there since D58's round 1), with per_step (the before), warp-specialized + persistent +
# bulk (the plugin's own form: 2 consumer warpgroups + a producer), and that with D55's ping-pong (~3.5 min). genpath2-tiles: the three tiles with
# panel 8 (128x256x64/3, 128x256x64/4 with the C tile in halves, 128x128x64/4) in one process, the plugin beside the
# general default and the default with per_step indices (the before at 128x128), cuBLAS in the same process (~3.5 min)
step genpath2 bash -c 'rc=0; timeout 110 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_general_gemm.py \
       tests/test_persistent.py -k "device or panel" -rs || rc=$?;
     timeout 120 python3 benchmarks/general_gemm.py --rep 40 --sizes 4096,8192 --dtypes float16,bfloat16 \
       --configs 128:128:64:256:4:8 --variants default,default-per-step,ws+persistent+bulk,ws+persistent+bulk+pingpong \
       || rc=$?; exit $rc'
step genpath2-tiles bash -c 'timeout 225 python3 benchmarks/general_gemm.py --rep 40 --sizes 4096,8192 \
       --dtypes float16,bfloat16 --configs 128:256:64:256:3:8,128:256:64:256:4:8,128:128:64:256:4:8 \
       --variants default,default-per-step'
# D62 (issue 11): the general path's 128x128x64/4 k step. gemm128-tests: the device tests of D62's options (float64
# and bit for bit the default general path; 128x128/4 4096^3 panel 8, ragged bf16, 128x256/3 and /4, K shorter than
# the stages; each kernel run twice). gemm128: 128x128x64/4 panel 8, fp16 and bf16, 4096^3 and 8192^3, one process:
# the plugin, the general default (the before), D59's uniform warp index + shifts ("us"), the release barriers (no
# block barrier in the loop), us + release, us + release + descriptor offsets, us with the stage ahead issued by
# thread 224 (t224) with the block barrier and with the release barriers, warp-specialized + us, and that with
# descriptor offsets; cuBLAS beside (~2.5 min). gemm128-tiles: the bar's three tiles (128x256x64/3, 128x256x64/4,
# 128x128x64/4, panel 8) in one process: the plugin, the general default and D62's candidates (~3 min)
step gemm128-tests timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_gemm_kstep.py -k device -rs
step gemm128 timeout 230 python3 benchmarks/general_gemm.py --rep 40 --sizes 4096,8192 --dtypes float16,bfloat16 \
       --configs 128:128:64:256:4:8 \
       --variants default,default-us,default-release,default-us-release,default-us-release-doff,default-us-t224,default-us-release-t224,ws-us,ws-us-doff
step gemm128-tiles timeout 230 python3 benchmarks/general_gemm.py --rep 40 --sizes 4096,8192 --dtypes float16,bfloat16 \
       --configs 128:256:64:256:3:8,128:256:64:256:4:8,128:128:64:256:4:8 \
       --variants default,default-us-release-doff,ws-us-doff
# D62 round 2: the candidates again, each process twice (the rows' noise): 128x128x64/4 panel 8 with the plugin, the
# default, us, us + descriptor offsets, us with thread 224 issuing, ws + us, ws + us + descriptor offsets (~1.5 min);
# then the three tiles with the plugin, the default, us, us + doff, ws + us + doff (~2.5 min)
step gemm128-r2 bash -c 'rc=0; for r in 1 2; do timeout 110 python3 benchmarks/general_gemm.py --rep 60 --sizes 4096,8192 \
       --dtypes float16,bfloat16 --configs 128:128:64:256:4:8 \
       --variants default,default-us,default-us-doff,default-us-t224,ws-us,ws-us-doff || rc=$?; done; exit $rc'
step gemm128-tiles-r2 bash -c 'rc=0; for r in 1 2; do timeout 115 python3 benchmarks/general_gemm.py --rep 60 --sizes 4096,8192 \
       --dtypes float16,bfloat16 --configs 128:256:64:256:3:8,128:256:64:256:4:8,128:128:64:256:4:8 \
       --variants default,default-us,default-us-doff,ws-us-doff || rc=$?; done; exit $rc'
# D62 round 3 (the defaults: the uniform warp index and shifts in persistent GEMMs; the plain 16-bit GEMM routed to
# the general path). gemm128-bar: the bar's three tiles (128x256x64/3, /4, 128x128x64/4, panel 8), fp16 and bf16,
# 4096^3 and 8192^3, one process, each tile's kernels timed in turn 5 rounds (medians): the plugin (pinned), D58's
# general default (d58), the general default, the routed default through the plugin's passes; cuBLAS beside (~2.5 min).
# gemm128-plugin: the plugin's and the general path's GEMM device tests with the routing on (the plugin's pinned to
# it: float64, bits). gemm128-catalog: the catalog on cuda:sm_90a in device mode with the defaults (the two nt
# warpgroup_tile GEMMs routed). gemm128-table: benchmarks/cuda_gemm.py's GEMM rows (the performance table's), routed
# (the default) and with the plugin kept (general_plain_gemm=false), cuBLAS and Triton in each process
step gemm128-bar timeout 230 python3 benchmarks/general_gemm.py --rep 30 --rounds 5 --sizes 4096,8192 \
       --dtypes float16,bfloat16 --configs 128:256:64:256:3:8,128:256:64:256:4:8,128:128:64:256:4:8 \
       --variants d58,default,routed-default
step gemm128-plugin timeout 230 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_hopper.py \
       tests/test_cuda_persistent.py tests/test_cuda_tma_store.py tests/test_general_gemm.py tests/test_cuda_splitk.py -k device -rs
step gemm128-catalog bash -c 'rc=0; timeout 230 python3 -m tilecore conformance run --target cuda:sm_90a -n 12 \
       --report /tmp/rep/cuda-d62 || rc=$?; python3 -c "import json; m = json.load(open(\"/tmp/rep/cuda-d62/manifest.json\"));
print(m.get(\"mode\", m.get(\"target\")), m[\"counts\"])" || rc=1; exit $rc'
step gemm128-table bash -c 'rc=0; timeout 110 python3 benchmarks/cuda_gemm.py --rep 20 --sizes 4096,8192 --no-fp8 --triton || rc=$?;
     TILECORE_PASS_CONFIGS="{\"tilecore.cuda.general_plain_gemm\": false}" timeout 110 python3 benchmarks/cuda_gemm.py \
       --rep 20 --sizes 4096,8192 --no-fp8 --triton || rc=$?; exit $rc'
# the catalog with the plain Hopper GEMM routed to the general path (tilecore.cuda.general_plain_gemm, D51/D56), with
# tilecore.persistent=auto (the candidate default), then with every kernel of the persistent form on 2 blocks; device mode, the PASS counts
step genpath-catalog bash -c 'rc=0;
     python3 -m tilecore conformance run --target cuda:sm_90a -n 12 --report /tmp/rep/cuda-routed \
       --pass-config tilecore.cuda.general_plain_gemm=true --pass-config tilecore.persistent=auto || rc=$?;
     python3 -m tilecore conformance run --target cuda:sm_90a -n 12 --report /tmp/rep/cuda-routed-persistent \
       --pass-config tilecore.cuda.general_plain_gemm=true --pass-config tilecore.persistent=2 || rc=$?;
     for r in cuda-routed cuda-routed-persistent; do python3 -c "import json, sys; m = json.load(open(sys.argv[1]));
print(sys.argv[2], m.get(\"mode\", m.get(\"target\")), m[\"counts\"])" /tmp/rep/$r/manifest.json $r || rc=1; done; exit $rc'
# thread-block clusters of two with TMA multicast on the persistent GEMM (decisions D44, D49): the device tests (float64,
# bit for bit the config off; each stage release; the profile's counts), then D49's diagnosis at fp16 4096^3: off / 2x1
# x the stage releases (per thread, per warp, D44's release at cluster scope) timed at 3 and 4 stages and profiled once
# each (where each block's cycles go: waits for a free stage, for a full one, releasing; the two blocks' skew), then the
# timings: off and 2x1 / 1x2 with each release, 128x256 at 3 stages, fp16 and bf16 at 4096^3 and 8192^3, same bits
# checked, cuBLAS and Triton beside (a hang ends at the timeouts; about 2.5 min)
step mcast bash -c 'rc=0; timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_mcast.py -k device -rs || rc=$?;
     timeout 90 python3 benchmarks/cuda_gemm.py --rep 10 --sizes 4096 --dtypes float16 --no-fp8 --cluster-multicast off,2x1 \
       --stage-release thread,warp,d44 --profile --configs 128:256:64:256:3:8,128:256:64:256:4:8 || rc=$?;
     timeout 240 python3 benchmarks/cuda_gemm.py --rep 10 --sizes 4096,8192 --no-fp8 --triton --cluster-multicast off,2x1,1x2 \
       --stage-release thread,warp,d44 --configs 128:256:64:256:3:8 || rc=$?; exit $rc'
# D60 round 2, what the exact build's gap to fast math is made of (diagnostic rows: the NVRTC flags fast math implies,
# added one at a time to the exact build; --ftz=true drops exp2f's subnormal path, --fmad=true contracts s c - m c;
# neither keeps the exact build's contract), exact 128 x 128 causal and not, ping-pong on (the exact default) and
# off; then the exact defaults against rows / poly1 / late8 again (the noise), fast math with ping-pong off (its
# default) and on, and exact causal at 128 x 160 and 128 x 144 (no spills; ptxas's planned cycles a key column 8.1 and
# 8.3 against 8.4 at 128 x 128); cuDNN in each process (about 3.5 minutes)
step causalx2 bash -c 'rc=0; D=default/default; B="python3 benchmarks/cuda_attention.py --rep 5 --inner-rep 10 --blocks 128x128x256x2";
     for fl in "[\"--ftz=true\"]" "[\"--fmad=true\"]" "[\"--ftz=true\",\"--fmad=true\"]"; do
       timeout -k 5 50 $B --causal both --combos $D/default,overlap/default/default --pass-config "tilecore.extra_flags=$fl" || rc=$?; done;
     timeout -k 5 60 $B --causal both --combos $D/default,$D/rows,$D/poly1,$D/late8,$D/default || rc=$?;
     timeout -k 5 40 $B --causal both --no-exact --fast-math --combos $D/default,both/default/default || rc=$?;
     timeout -k 5 40 python3 benchmarks/cuda_attention.py --rep 5 --inner-rep 10 --causal yes \
       --blocks 128x160x256x2,128x144x256x2 || rc=$?; exit $rc'
# D54's default (heaviest first on): the default build against the grid order in one process, exact causal at batch 1
# (round 2 measured the option at +10.5% here), under a minute
step causal3 timeout -k 5 55 python3 benchmarks/cuda_attention.py --rep 5 --inner-rep 20 --batch 1 --heads 32 --seq 4096 \
     --causal yes --order grid,default --blocks 128x128x256x2
# issue 11's leftovers (D47): the 64-byte-swizzle tiles' and vector copies' tests (float64 on the GPU), then one run of
# the split-K clusters the driver holds at once beside the profile's execution.cluster.at_once, shared -> global
# copies element vs 16-byte, and block_K = 32 GEMMs on the general path (before) vs the register programs (after),
# torch / cuBLAS beside
step tidy bash -c 'rc=0; python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_swizzle64.py \
     tests/test_vectorize_copies.py tests/test_cuda_clusters_at_once.py -rs || rc=$?;
     python3 benchmarks/cuda_tidy.py --rep 20 || rc=$?; exit $rc'
# one copy of the persistent GEMM's main loop (decision D50: no peeled last k step): cold compile pinned to one CPU,
# 7 fresh processes each, round robin: the default, the same with the last k step peeled (D50 undone) and, with
# .whl_before/ carried, the tree before (its wheels in their own folder); then, in one process, both forms' compile
# CPU time and SASS, and fp16 / bf16 TFLOP/s at 4096^3 and 8192^3 (128x256x64, 4 and 3 stages), same bits checked,
# cuBLAS beside; then (--mainloop) the per-tile and split-K kernels' k loops unrolled by NVVM (their default) and not
# (measured in D50, not taken): compile CPU, SASS, us per call at 4096^3, 8192^3 and three few-tile shapes, fp16 / bf16,
# same bits, cuBLAS beside; about 160 s
step cold2 bash -c 'B=; if [ -d .whl_before ]; then python3 -m pip install -q --no-index --no-deps --no-compile \
       --no-cache-dir --upgrade --target /tmp/site_before .whl_before/*.whl .whl/[!t]*.whl && B="--before-site /tmp/site_before"; fi;
     rc=0; timeout -k 5 150 python3 benchmarks/cold_compile.py --repeat 7 --cpus 1 --variants default,peeled $B || rc=$?;
     timeout -k 5 120 python3 benchmarks/persistent_peel.py --rep 20 --repeat 5 || rc=$?;
     timeout -k 5 120 python3 benchmarks/persistent_peel.py --mainloop --rep 20 || rc=$?; exit $rc'
# D61 (issue 11): FlashAttention on the general path against the register program on every row of the table and the
# benchmarks, each in one process with cuDNN beside (b8 h32 s4096; every block's own TFLOP/s in the log's lines).
# fagen-tests: D61's device tests (the general path's row division bit for bit the IEEE division on six shapes and
# against float64), D59's default forms, D60's division tests. fagen-128: d128 at 128x128 and 128x176, exact and fast
# math, causal and not: the register program / the general path before D61 (nodiv) / the general default.
# fagen-fast: fast math, the general path's max / min as a compare and a select (tcmax: before D61), without ping-pong's turns (nopp: the register program's fast-math
# schedule) and with thread 0 issuing (thread0). fagen-d64: d64 (three blocks; exact with V staged regardless of
# occupancy, stage: tilecore.pipeline_stage_late=True, the rotation's form). fagen-64: d128 at the one-warpgroup 64x64
# (stage; stage_ws: with the producer warpgroup asked for). fagen-d256: 128x64 and 64x64 (ws1: the producer warpgroup
# asked for at one consumer). fagen-gqa: grouped-query attention (8 KV heads, 2 and 3 stages). fagen-auto: the catalog
# with tilecore.cuda.register_programs="auto" in device mode. Each about 2-4 min
step fagen-tests bash -c 'rc=0; timeout -k 5 170 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_general_attention.py \
       -rs -k "d61 or d59_default or divi or auto or staging" || rc=$?;
     timeout -k 5 60 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_row_division.py -rs || rc=$?; exit $rc'
# D61's confirmation on the merged tree (three steps, each under 90 s): fagen-confirm-tests: D61's and D59's device
# tests of the general path's attention (the division, the bulk store of O bit for bit the direct stores, the staged
# and specialized forms, fast math, against float64) and D60's division tests; fagen-confirm: d128 128x128, exact and
# fast math, causal and not: the register program / the general default (O by bulk stores) / its direct stores
# (direct), cuDNN beside; then conformance-general (the catalog on the general path with the defaults)
step fagen-confirm-tests bash -c 'rc=0; timeout -k 5 85 python3 -m pytest -q -n 8 -p no:cacheprovider \
       tests/test_cuda_general_attention.py tests/test_cuda_row_division.py -rs -k "d61 or d59_default or device" || rc=$?; exit $rc'
step fagen-auto python3 -m tilecore conformance run --target cuda:sm_90a -n 8 --report /tmp/rep/cuda-auto \
     --pass-config tilecore.cuda.register_programs=auto
# D66's route: the catalog on cuda:sm_90a (device mode) with tilecore.cuda.register_programs="auto" and D66's
# options as "auto" (FlashAttention's form only), then every kernel on the general path with them. About 2 min
step fa66-conformance bash -c 'rc=0; A="--pass-config tilecore.cuda.descriptor_offsets=auto --pass-config tilecore.cuda.narrow_loop_counters=auto --pass-config tilecore.reduce_chains=auto";
     timeout -k 5 110 python3 -m tilecore conformance run --target cuda:sm_90a -n 8 --report /tmp/rep/cuda-d66-auto \
       --pass-config tilecore.cuda.register_programs=auto $A || rc=$?;
     timeout -k 5 110 python3 -m tilecore conformance run --target cuda:sm_90a -n 8 --report /tmp/rep/cuda-d66-general \
       --pass-config tilecore.cuda.register_programs=false $A || rc=$?; exit $rc'
# the sm_80 register program (mma.sync + cp.async) against the core's general path (decision D63): on the H100 every
# kernel built with tilecore.cuda.disable_wgmma and the sm_80 profile overlaid (tilecore.capability_overlay: mma.sync
# units only, no TMA / warp specialization / clusters, 163 KiB a block: what an A100 plans). Rows: regprog (the
# register program forced where it takes the kernel), general-d62 (the general path before D63), general (with D63's
# defaults: barriers pruned, a one-gemm launch's k steps unrolled), lean (+ relay tiles folded + D55's options),
# default (D63's routing). GEMM + bias + ReLU 4096^3 at 128x128x32 / 64x128x64 / 256x128x32, the bf16 NT GEMM,
# TileLang's FlashAttention forward (b8 h32 s4096 d128) causal and not at 128x128 and non-causal at 64x64, softmax and
# RMSNorm 4096x8192, the 777-column GEMM; torch / cuBLAS / SDPA in the same process; then D63's device tests
# (float64). About 3 min
step mmasync bash -c 'rc=0;
     timeout -k 5 130 python3 benchmarks/mma_general.py --rep 10 --only fa,fa_causal,fa64 \
       --variants "${MMA_FA_VARIANTS:-regprog,general-d62,general,lean,default}" || rc=$?;
     timeout -k 5 90 python3 benchmarks/mma_general.py --rep 20 --only gemm_epi,gemm_epi_64,gemm_epi_256,gemm_nt,gemm_relay,softmax,rmsnorm,gemm777 \
       --variants "${MMA_VARIANTS:-regprog,general-d62,general,relay,default}" || rc=$?;
     timeout -k 5 60 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mma_general.py -rs -k device || rc=$?; exit $rc'
# FlashAttention on sm_80's general path at the register program's speed (D68): the sm_80 profile overlaid as in
# mmasync; TileLang's forward at 128x128 (256 threads) and 64x64 (128 threads), causal and not, d128 (mmafa) and d64
# (mmafa64, with the GEMM rows); rows regprog (the register program), general-d63 (the general path before D68),
# general-x2 (the index shifts, B by .x2), general (D68's defaults: + B pairs by .x4), d55 (+ D55's options), fold
# (+ the relay fold: V staged), lean (+ both); SDPA / cuBLAS in the same process.
# Then the device tests of the sm_80 paths (mmafa-tests). About 3 min each
step mmafa timeout -k 5 220 python3 benchmarks/mma_general.py --rep 10 --only fa,fa_causal,fa64,fa64_causal \
     --variants "${MMAFA_VARIANTS:-regprog,general-d63,general-x2,general,d55,fold,lean}"
step mmafa64 bash -c 'rc=0;
     timeout -k 5 150 python3 benchmarks/mma_general.py --rep 10 --fa 8,32,4096,64 --only fa,fa_causal,fa64,fa64_causal \
       --variants "${MMAFA64_VARIANTS:-regprog,general-d63,general,d55,fold,lean}" || rc=$?;
     timeout -k 5 80 python3 benchmarks/mma_general.py --rep 20 --only gemm_epi,gemm_epi_64,gemm_epi_256,gemm_nt,gemm_relay \
       --variants "${MMAFA_GEMM_VARIANTS:-regprog,general-d63,general-x2,general}" || rc=$?; exit $rc'
step mmafa-tests timeout -k 5 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mma_general.py -rs -k device
# D71 (issue 11 item 4): tilecore.pipeline_late_copy on sm_80's FlashAttention general path: every row D68 measured
# (d128 in sm80fa, d64 in sm80fa64; 128x128 / 256 threads and 64x64 / 128 threads, causal and not), rows regprog (the
# register program), general (D68's defaults: V issued after the softmax, waited for with K's stage ahead), late (V
# issued at the top of the iteration, one buffer; staged at d64 64x64: one wait at the top), late-joint (V's wait also
# K's; round 1 only), late-d55 (+ D55's options: the masked iterations split), late-staged (V staged where it fits:
# 128x128 d64, 64x64 d128), fold-late (O_shared folded, V staged, one wait and one barrier an iteration: the register
# program's schedule), lean-late (D68's lean: the fold and D55's options, + the late copy); each kernel's rows timed in order then in reverse (compiled once). About 1.5-2.5 min each. Then the
# option's device tests against float64 (sm80fa-tests)
step sm80fa timeout -k 5 200 python3 benchmarks/mma_general.py --rep 10 --orders 2 --only fa,fa_causal,fa64,fa64_causal \
     --variants "${SM80FA_VARIANTS:-regprog,general,late,late-d55,late-staged,fold-late,lean-late}"
step sm80fa64 timeout -k 5 200 python3 benchmarks/mma_general.py --rep 10 --orders 2 --fa 8,32,4096,64 \
     --only fa,fa_causal,fa64,fa64_causal --variants "${SM80FA_VARIANTS:-regprog,general,late,late-d55,late-staged,fold-late,lean-late}"
step sm80fa-tests timeout -k 5 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mma_general.py -rs -k "device and late_copy"
# D73 (issue 11 item 4): sm_80's FlashAttention routed by form (the sm_80 profile overlaid as in mmasync): the rows
# D71 measured, 128x128 / 256 threads and 64x64 / 128 threads, causal and not, d128 (sm80route) and d64 (sm80route64),
# fast math (TileLang's example); rows regprog (the register program, forced), default (the route: the general path
# with the form's defaults, the late copy and D55's options, at 128 rows or head dimension 128; 64x64 d64 on the
# register program; since round 2 at 128 rows with tilecore.prune_false_comparisons: the non-causal mask's edge test
# folded), default-nofalse (round 1's default: without it; default-false: with it at every routed shape), general-d68
# (D68's general path: those options off), attention-all (d64 only: every shape routed, 64x64 d64 on the general path
# with the form's defaults; attention-all-false with the false comparisons folded); each kernel's rows in order then
# reversed (compiled once). sm80route-exact: the same rows in the exact build, regprog / default / default-nofalse.
# sm80route-tests: the routed defaults (and those rows) against float64 on the device. About 1 min each
step sm80route timeout -k 5 200 python3 benchmarks/mma_general.py --rep 10 --orders 2 --only fa,fa_causal,fa64,fa64_causal \
     --variants "${SM80ROUTE_VARIANTS:-regprog,default,default-nofalse,general-d68}"
step sm80route64 timeout -k 5 200 python3 benchmarks/mma_general.py --rep 10 --orders 2 --fa 8,32,4096,64 \
     --only fa,fa_causal,fa64,fa64_causal --variants "${SM80ROUTE64_VARIANTS:-regprog,default,default-nofalse,general-d68,attention-all}"
step sm80route-exact bash -c 'rc=0;
     timeout -k 5 110 python3 benchmarks/mma_general.py --rep 10 --orders 2 --exact --only fa,fa_causal,fa64,fa64_causal \
       --variants "${SM80ROUTE_EXACT_VARIANTS:-regprog,default,default-nofalse}" || rc=$?;
     timeout -k 5 110 python3 benchmarks/mma_general.py --rep 10 --orders 2 --exact --fa 8,32,4096,64 \
       --only fa,fa_causal,fa64,fa64_causal --variants "${SM80ROUTE_EXACT_VARIANTS:-regprog,default,default-nofalse}" || rc=$?; exit $rc'
step sm80route-tests timeout -k 5 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mma_route.py -rs -k device
# D79 (issue 11 item 4): sm_80's last FlashAttention register program form, 64x64 d64 (128 threads), causal and not,
# the sm_80 profile overlaid as in sm80route; rows regprog (the register program: the default there), attention-all
# (D73's general path with the form's defaults), join (+ the stage ahead's K and V one commit group), lead-grouped (the
# Q copy issued by the core as its own group: its tile swizzled; wait and barrier kept), lead (+ Q landed by the
# loop's first wait), d79 (join + lead), d79-narrow (+ 32-bit loop counters), d79-fold (+ O_shared folded:
# O stored from registers, 40 KiB a block); fast math, the exact build, then fast
# math with each kernel's block memory carveout at 71% (sm80d64-a100: 164 KiB an SM, an A100's blocks an SM; the
# blocks/SM column says how many fit), each kernel's rows in order then reversed (compiled once). sm80d64-tests: the D79 rows and
# D71's (the float64 helper test_mma_route now shares) against float64 on the device. About 2 / 1 / 1 min
step sm80d64 bash -c 'rc=0; V="${SM80D64_VARIANTS:-regprog,attention-all,join,lead-grouped,lead,d79,d79-narrow,d79-fold}";
     B="python3 benchmarks/mma_general.py --rep 10 --orders 2 --fa 8,32,4096,64 --only fa64,fa64_causal";
     timeout -k 5 100 $B --variants "$V" || rc=$?;
     timeout -k 5 80 $B --exact --variants "${SM80D64_EXACT_VARIANTS:-regprog,attention-all,lead,d79,d79-narrow}" || rc=$?; exit $rc'
step sm80d64-a100 timeout -k 5 100 python3 benchmarks/mma_general.py --rep 10 --orders 2 --fa 8,32,4096,64 --only fa64,fa64_causal \
     --carveout 71 --variants "${SM80D64_CARVEOUT_VARIANTS:-regprog,attention-all,lead,d79,d79-narrow,d79-fold}"
# D79 on the routed rows (D73's: 128x128 and 64x64 at d128, 128x128 at d64, causal and not, fast math): the route's
# default against the default with Q landed by the loop's first wait (default-lead: Q's tile swizzled, its ldmatrix
# without bank conflicts) and the register program. About 2 min
step sm80d64-routed bash -c 'rc=0; B="python3 benchmarks/mma_general.py --rep 10 --orders 2 --variants regprog,default,default-lead";
     timeout -k 5 100 $B --only fa,fa_causal,fa64,fa64_causal || rc=$?;
     timeout -k 5 70 $B --fa 8,32,4096,64 --only fa,fa_causal || rc=$?; exit $rc'
# D79 round 2: the route's new default (64x64 d64 routed; the lead copy and the joined group among the form's defaults)
# against the register program on D73's eight rows (fast math; the newly routed 64x64 d64 also in the exact build),
# and an unmeasured shape the route keeps, 64 rows at d256 (attention-all: routed with the form's defaults), for the
# record. sm80d64-tests2: every device test of test_mma_route and test_mma_general against float64. About 2.5 / 1.5 min
step sm80d64-r2 bash -c 'rc=0; B="python3 benchmarks/mma_general.py --rep 10 --orders 2";
     timeout -k 5 70 $B --only fa,fa_causal,fa64,fa64_causal --variants regprog,default || rc=$?;
     timeout -k 5 70 $B --fa 8,32,4096,64 --only fa,fa_causal,fa64,fa64_causal --variants regprog,default || rc=$?;
     timeout -k 5 45 $B --exact --fa 8,32,4096,64 --only fa64,fa64_causal --variants regprog,default || rc=$?;
     timeout -k 5 60 $B --fa 8,32,4096,256 --only fa64,fa64_causal --variants regprog,attention-all || rc=$?; exit $rc'
# D79 round 2, for the record: sm_86 / sm_89's block memory (99 KiB a block; the carveout keeps 100 KiB an SM), where
# the route keeps FlashAttention on the register program: regprog vs attention-all (routed with the form's defaults)
# at 64x64 d64 and d128, causal and not. About 1.5 min
step sm80d64-sm86 bash -c 'rc=0; B="python3 benchmarks/mma_general.py --rep 10 --orders 2 --profile sm86 --carveout 43 --only fa64,fa64_causal --variants regprog,attention-all";
     timeout -k 5 60 $B --fa 8,32,4096,64 || rc=$?; timeout -k 5 60 $B || rc=$?; exit $rc'
step sm80d64-tests2 timeout -k 5 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mma_route.py tests/test_mma_general.py -rs -k device
step sm80d64-tests timeout -k 5 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mma_route.py tests/test_mma_general.py -rs -k "device and (d79 or late_copy or default_lead)"
# D85 (issue 11): sm_86 / sm_89's FlashAttention routed to the core's general path (sm_86's / sm_89's block memory
# through D63's overlay, --profile sm86: 99 KiB a block; --carveout 43 keeps 100 KiB an SM, the blocks an SM those
# GPUs hold): rows regprog (the register program, forced) and default (the route: the general path with the form's
# defaults where its least plan fits the block memory); torch SDPA in every row; fast math; each kernel's rows in
# order then reversed (compiled once). sm86: TileLang's forward at d64 (128x128 / 256 threads, 64x64 / 128 threads)
# and d128 (64x64), causal and not. About 2 min. sm86-more: the same rows for the catalog's kernel in bfloat16 (bfa64:
# 64x64, d64 and d128; round 1: the catalog's own kernel, P in block memory on the general path, now bcat64; cfa64:
# the same in fp16, now cat64) and TileLang's at 128 rows x 32 keys (fa_n32: d64,
# d128). About 2 min.
# sm86-tests: D85's device tests (the sm86 profile's routed forms, fp16 / bf16, causal and not, fast and exact,
# against float64). About 1.5 min
step sm86 bash -c 'rc=0; B="python3 benchmarks/mma_general.py --rep 10 --orders 2 --profile sm86 --carveout 43 --variants ${SM86_VARIANTS:-regprog,default}";
     timeout -k 5 100 $B --fa 8,32,4096,64 --only fa,fa_causal,fa64,fa64_causal || rc=$?;
     timeout -k 5 60 $B --only fa64,fa64_causal || rc=$?; exit $rc'
step sm86-more bash -c 'rc=0; B="python3 benchmarks/mma_general.py --rep 10 --orders 2 --profile sm86 --carveout 43 --variants ${SM86_VARIANTS:-regprog,default}";
     timeout -k 5 70 $B --fa 8,32,4096,64 --only bfa64,bfa64_causal,cat64,cat64_causal || rc=$?;
     timeout -k 5 40 $B --only bfa64,bfa64_causal || rc=$?;
     timeout -k 5 60 $B --fa 8,32,4096,64 --only fa_n32,fa_n32_causal || rc=$?;
     timeout -k 5 40 $B --only fa_n32,fa_n32_causal || rc=$?; exit $rc'
# D85 round 2: the catalog's kernel in bf16 with TileLang's warp policy (FullRow: P in registers on the general path),
# routed on sm_86 / 89: 128x128 d64 and 64x64 d64 / d128, regprog vs default; then the catalog's own kernel (no
# policy: P in block memory on the general path, which round 1 measured at 0.56-0.89x with sm_86's block memory) on
# the sm_80 profile, where D79 routed it: regprog (the new default there) vs attention-all (D79's route), 64x64 d64
# and d128, fast math. About 2.5 min
step sm86-r2 bash -c 'rc=0; B="python3 benchmarks/mma_general.py --rep 10 --orders 2";
     S="$B --profile sm86 --carveout 43 --variants regprog,default";
     timeout -k 5 70 $S --fa 8,32,4096,64 --only bfa,bfa_causal,bfa64,bfa64_causal || rc=$?;
     timeout -k 5 40 $S --only bfa64,bfa64_causal || rc=$?;
     timeout -k 5 40 $B --fa 8,32,4096,64 --only cat64,cat64_causal --variants regprog,attention-all || rc=$?;
     timeout -k 5 40 $B --only cat64,cat64_causal --variants regprog,attention-all || rc=$?; exit $rc'
# D85 round 3: the routed forms in the exact build (without the kernels' fast math) with sm_86's profile: TileLang's
# forward at 128x128 d64 and 64x64 d64 / d128, causal and not, regprog vs default; then the catalog's attention cases
# with the sm_80 profile (device mode, the default route: the catalog's 64x64 kernel back on the register program
# there). About 2.5 min
step sm86-r3 bash -c 'rc=0; S="python3 benchmarks/mma_general.py --rep 10 --orders 2 --exact --profile sm86 --carveout 43 --variants regprog,default";
     timeout -k 5 80 $S --fa 8,32,4096,64 --only fa,fa_causal,fa64,fa64_causal || rc=$?;
     timeout -k 5 50 $S --only fa64,fa64_causal || rc=$?;
     OV=$(python3 -c "import sys, json; sys.path.insert(0, \"benchmarks\"); import mma_general as m; print(json.dumps(m.SM80))");
     timeout -k 5 60 python3 -m tilecore conformance run --target cuda:sm_90a -n 8 --report /tmp/rep/cuda-sm80-d85 \
       -k attention --pass-config tilecore.cuda.disable_wgmma=true --pass-config "tilecore.capability_overlay=$OV" || rc=$?; exit $rc'
# the catalog's attention cases with sm_86's profile overlaid (device mode): the default route. < 1 min
step sm86-catalog bash -c 'OV=$(python3 -c "import sys, json; sys.path.insert(0, \"benchmarks\"); import mma_general as m; print(json.dumps(m.SM86))");
     timeout -k 5 100 python3 -m tilecore conformance run --target cuda:sm_90a -n 8 --report /tmp/rep/cuda-sm86-default \
       -k attention --pass-config tilecore.cuda.disable_wgmma=true --pass-config "tilecore.capability_overlay=$OV"'
step sm86-tests timeout -k 5 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mma_route_sm86.py -rs -k device
# the TileLang corpus's attention examples whose kernels fit sm_86's 99 KiB (the backward examples of MHA: their
# forward kernels, 64x64 d64, now routed) with sm_86's profile as every compile's default, against each example's
# own reference (the forward examples at 128x128 d128 and GQA's backward need more than 99 KiB on both paths). < 1 min
step sm86-corpus bash -c 'OV=$(python3 -c "import sys, json; sys.path.insert(0, \"benchmarks\"); import mma_general as m; print(json.dumps({**m.BASE, \"tilecore.capability_overlay\": m.SM86}))");
     TILECORE_PASS_CONFIGS="$OV" TILECORE_CORPUS_DEVICE=cuda:sm_90a timeout -k 5 150 python3 -m pytest -q -n 8 \
       -p no:cacheprovider tests/test_tilelang_corpus.py -k "test_device and attention_mha_bwd" -rxXf'
# the TileLang corpus's attention examples (forward and backward; the route takes the forward kernels at 128 rows or
# d128, the backward examples' forward kernels among them) with the sm_80 paths on the device (the overlay as every
# compile's default), against each example's own reference (attention_gqa_bwd left out: its dK / dV kernel needs 221
# KiB of block memory, refused under the sm_80 profile's 163). About 1 min
step sm80route-corpus bash -c 'OV=$(python3 -c "import sys, json; sys.path.insert(0, \"benchmarks\"); import mma_general as m; print(json.dumps(m.BASE))");
     TILECORE_PASS_CONFIGS="$OV" TILECORE_CORPUS_DEVICE=cuda:sm_90a timeout -k 5 200 python3 -m pytest -q -n 8 \
       -p no:cacheprovider tests/test_tilelang_corpus.py -k "test_device and attention and not gqa_bwd" -rxXf'
# the catalog with the sm_80 paths (D63), device mode: the sm_80 profile overlaid on the H100 (the three feature/
# cases that require TMA, warp specialization or clusters left out: the overlay removes those features), once with
# the defaults (D63's routing: the GEMM form on the general path, attention on the register program; pruned
# barriers) and once with every kernel on the general path and every D63 option (relay tiles folded, every k step
# unrolled, D55's options). About 1.5 min
step mmasync-catalog bash -c 'rc=0; OV=$(python3 -c "import sys, json; sys.path.insert(0, \"benchmarks\"); import mma_general as m; print(json.dumps(m.SM80))");
     K="not bulk_tensor_copy and not warp_specialization and not clusters";
     timeout -k 5 100 python3 -m tilecore conformance run --target cuda:sm_90a -n 8 --report /tmp/rep/cuda-sm80-default \
       -k "$K" --pass-config tilecore.cuda.disable_wgmma=true --pass-config "tilecore.capability_overlay=$OV" || rc=$?;
     timeout -k 5 100 python3 -m tilecore conformance run --target cuda:sm_90a -n 8 --report /tmp/rep/cuda-sm80-d63 \
       -k "$K" --pass-config tilecore.cuda.disable_wgmma=true --pass-config tilecore.cuda.register_programs=false \
       --pass-config "tilecore.capability_overlay=$OV" --pass-config tilecore.fold_relay_tiles=true \
       --pass-config tilecore.prune_barriers=true --pass-config tilecore.cuda.unroll_matrix_steps=true \
       --pass-config tilecore.store_cast_once=true --pass-config tilecore.prune_condition_binds=true \
       --pass-config tilecore.split_masked_iterations=true || rc=$?; exit $rc'
# D65 (helper compcost): the general path's GEMM compiled as cheaply as the plugin's. compcost-bar: the bar's three
# tiles (128x256x64/3, /4, 128x128x64/4, panel 8), fp16 and bf16, 4096^3 and 8192^3, one process, each tile's kernels
# timed in turn 5 rounds (medians): the plugin (pinned), the general default (D65's matrix-store addresses), the same
# with D65's source changes undone (d65-off: the before), the routed GEMM through the plugin's passes; cuBLAS beside
# (~2.5 min). compcost-tests: the general path's GEMM device tests (float64, bits of every option; the matrix stores'
# tiles) and D62's k-step tests. compcost-cold: the cold compile of the routed GEMM against the plugin's (fresh
# processes with torch imported, one CPU, no launch)
step compcost-bar timeout 230 python3 benchmarks/general_gemm.py --rep 30 --rounds 5 --sizes 4096,8192 \
       --dtypes float16,bfloat16 --configs 128:256:64:256:3:8,128:256:64:256:4:8,128:128:64:256:4:8 \
       --variants default,d65-off,routed-default
step compcost-tests timeout 230 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_general_gemm.py \
       tests/test_gemm_kstep.py -k device -rs
step compcost-cold timeout 200 python3 benchmarks/cold_compile.py --repeat 5 --cpus 1 --no-launch --variants default,plugin
# D65 round 2 (the plain 16-bit GEMM routed to the general path by default again): compcost-routed-tests: the plugin's
# and the general path's GEMM device tests with the routing on (the plugin's files pin the pipeline: float64, bits);
# compcost-catalog: the catalog on cuda:sm_90a in device mode with the defaults (the two nt warpgroup_tile GEMMs
# routed); compcost-table: benchmarks/cuda_gemm.py's GEMM rows routed (the default) and with the plugin kept, cuBLAS in
# each process
step compcost-routed-tests timeout 230 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_hopper.py \
       tests/test_cuda_persistent.py tests/test_cuda_tma_store.py tests/test_cuda_splitk.py tests/test_gemm_kstep.py -k device -rs
step compcost-catalog bash -c 'rc=0; timeout 230 python3 -m tilecore conformance run --target cuda:sm_90a -n 12 \
       --report /tmp/rep/cuda-d65 || rc=$?; python3 -c "import json; m = json.load(open(\"/tmp/rep/cuda-d65/manifest.json\"));
print(m.get(\"mode\", m.get(\"target\")), m[\"counts\"])" || rc=1; exit $rc'
step compcost-table bash -c 'rc=0; timeout 110 python3 benchmarks/cuda_gemm.py --rep 20 --sizes 4096,8192 --no-fp8 || rc=$?;
     TILECORE_PASS_CONFIGS="{\"tilecore.cuda.general_plain_gemm\": false}" timeout 110 python3 benchmarks/cuda_gemm.py \
       --rep 20 --sizes 4096,8192 --no-fp8 || rc=$?; exit $rc'
# faroute-tests: D70's device tests (the unswitched iteration, with and without D66's chains, and D70's defaults bit
# for bit the defaults before D70 and against float64 on five forms, causal and not, ragged; fast math against
# float64) with D66's device tests (its options bit for bit the new defaults), ~2.5 min
step faroute-tests timeout -k 5 230 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_fa_unswitch.py \
     tests/test_cuda_fa_parity.py -rs
# faroute-conf: D70's defaults on the catalog's attention cases (cuda:sm_90a, device mode): on the general path and
# with the route "auto" (d256's exact build now routed), ~2 min
step faroute-conf bash -c 'rc=0; timeout -k 5 110 python3 -m tilecore conformance run --target cuda:sm_90a -n 8 -k attention \
       --report /tmp/rep/cuda-d70-general --pass-config tilecore.cuda.register_programs=false || rc=$?;
     timeout -k 5 110 python3 -m tilecore conformance run --target cuda:sm_90a -n 8 -k attention \
       --report /tmp/rep/cuda-d70-auto --pass-config tilecore.cuda.register_programs=auto || rc=$?; exit $rc'
# D76 (issue 17: fp16 / bf16 GEMM at 1.05x cuBLAS). gemm105-prof: Nsight Compute on one launch (clocks locked to base,
# caches flushed) of cuBLAS's kernel (torch.matmul) and ours on the default route (the general path) at 4096^3, side by
# side: launch (grid, block, cluster, registers, shared memory), cycles and FLOP per SM-cycle, issue slots, tensor pipe,
# dram / L2 bytes, stall reasons, samples by SASS region and class; fp16 with our 128x256x64/3 and 256x128x64/3 (cuBLAS's
# tile), bf16 with 128x256x64/3 (~2.5 min). gemm105-power: the same kernels back to back 2 s each under nvidia-smi's
# 50 ms samples (SM clock, board power, clock-event reasons), 4096^3 and 8192^3, Triton beside; then the table's burst
# launch by launch (benchmarks/gemm_burst.py: CUPTI durations of 30 back-to-back launches after 1 s idle, the gaps
# between kernels) for cuBLAS, ours and Triton (~2.5 min)
step gemm105-prof bash -c 'rc=0; timeout 110 python3 scripts/gemm_profile.py --size 4096 --dtypes float16 \
       --variants cublas,t128x256,t256x128 --timeout 45 || rc=$?;
     timeout 70 python3 scripts/gemm_profile.py --size 4096 --dtypes bfloat16 --variants cublas,t128x256 --timeout 40 \
       || rc=$?; exit $rc'
step gemm105-power bash -c 'rc=0; timeout 120 python3 benchmarks/gemm_power.py --sizes 4096,8192 --seconds 2 --triton \
       --configs 128:256:64:256:3:8,256:128:64:256:3:8 || rc=$?;
     timeout 60 python3 benchmarks/gemm_burst.py --sizes 4096,8192 --launches 30 --triton --pdl || rc=$?; exit $rc'
# D76 round 2. gemm105-prof2: ncu (locked clock) of cuBLAS and D76's candidates at fp16 4096^3: the default
# 128x256x64/3 panel 8, 4 stages (C stored in halves), descriptor offsets, panel 16 (DRAM bytes), the warp-specialized
# form (a producer warpgroup) at 3 and 4 stages (~1.5 min). gemm105-burst: the table's burst, launch by launch after 1 s
# idle (CUPTI): cuBLAS, then the default at /3 and /4 stages each plain, as a programmatic dependent launch (pdl),
# warp-specialized (ws-us-doff) and with descriptor offsets (default-us-doff); the median kernel and the median gap,
# fp16 / bf16 at 4096^3 and 8192^3 (~2 min)
step gemm105-prof2 timeout 170 python3 scripts/gemm_profile.py --size 4096 --dtypes float16 \
       --variants cublas,t128x256,t128x256s4,doff,p16,ws3,ws4 --timeout 40
step gemm105-burst timeout 200 python3 benchmarks/gemm_burst.py --sizes 4096,8192 --launches 30 \
       --configs 128:256:64:256:3:8,128:256:64:256:4:8 --pdl --variants "ws-us-doff;default-us-doff"
# D76 round 3 (the candidate round 2 found: the warp-specialized form, +1.0-1.2% at 4096^3 on an H200, at cuBLAS's
# cycles under ncu). gemm105-burst3: the burst twice (two processes): cuBLAS, the default /3 and /4, each warp-specialized
# (ws-us-doff) (~1.5 min). gemm105-table3: the table's rows with the defaults, with the warp-specialized form for
# every tilecore config (TILECORE_PASS_CONFIGS), the defaults again (~3 min)
step gemm105-burst3 bash -c 'rc=0; for r in 1 2; do timeout 80 python3 benchmarks/gemm_burst.py --sizes 4096,8192 \
       --launches 30 --configs 128:256:64:256:3:8,128:256:64:256:4:8 --variants ws-us-doff || rc=$?; done; exit $rc'
step gemm105-table3 bash -c 'rc=0; WS="{\"tilecore.cuda.register_programs\": false, \"tilecore.cuda.uniform_warp_index\": true,
       \"tilecore.cuda.nonnegative_index_shifts\": true, \"tilecore.warp_specialize\": true, \"tilecore.persistent\": true,
       \"tilecore.bulk_store\": true, \"tilecore.cuda.descriptor_offsets\": true}";
     for pc in "{}" "$WS" "{}"; do echo "== TILECORE_PASS_CONFIGS=$pc"; TILECORE_PASS_CONFIGS="$pc" timeout 60 \
       python3 benchmarks/cuda_gemm.py --rep 10 --sizes 4096,8192 --no-fp8 --triton \
       --configs 128:256:64:256:3:8,128:256:64:256:4:8 || rc=$?; done; exit $rc'
# gemm105-tests: the device tests of D76's programmatic launch (a chain of GEMMs each reading the previous one's
# output, back to back, bit for bit the chain without it; < 1 min)
step gemm105-tests timeout 120 python3 -m pytest -q -n 2 -p no:cacheprovider tests/test_programmatic_launch.py -rs
# gemm105: the bar's four rows (fp16 / bf16, 4096^3 / 8192^3), one process a dtype, candidate tiles (128x256x64/3
# the table's best; /4; 256x128x64/3 cuBLAS's shape, two warpgroups of 128 x 128; 128x256x128/2: half the k steps) on
# the default route (routed-auto), as a programmatic dependent launch (routed-pdl), with descriptor offsets (default-us-doff: one add between HGMMAs) and warp-specialized
# (ws-us-doff: a producer warpgroup + the two consumers, cuBLAS's form), each tile's kernels with cuBLAS and Triton timed
# in turn 5 rounds (10 calls, best of 3 batches: cuda_gemm.py's burst timing), medians, ratios to cuBLAS's median of
# the same rounds (~2.5 min)
G105_CONFIGS=${G105_CONFIGS:-128:256:64:256:3:8,128:256:64:256:4:8,256:128:64:256:3:8,128:256:128:256:2:8}
G105_VARIANTS=${G105_VARIANTS:-routed-auto,routed-pdl,default-us-doff,ws-us-doff}
step gemm105 bash -c 'rc=0; for d in float16 bfloat16; do timeout 115 python3 benchmarks/general_gemm.py --rep 10 \
       --rounds 5 --sizes 4096,8192 --dtypes $d --triton --no-plugin --configs "$0" --variants "$1" || rc=$?;
     done; exit $rc' "$G105_CONFIGS" "$G105_VARIANTS"
# gemm105-table: the issue table's GEMM rows (benchmarks/cuda_gemm.py, best of its configs, cuBLAS and Triton in each
# process) with the defaults, then with tilecore.cuda.programmatic_launch on (D76), then the defaults again (~3 min)
step gemm105-table bash -c 'rc=0; for pc in "{}" "{\"tilecore.cuda.programmatic_launch\": true}" "{}"; do
       echo "== TILECORE_PASS_CONFIGS=$pc"; TILECORE_PASS_CONFIGS="$pc" timeout 60 python3 benchmarks/cuda_gemm.py --rep 10 \
       --sizes 4096,8192 --no-fp8 --triton --configs 128:256:64:256:3:8,128:256:64:256:4:8 || rc=$?; done; exit $rc'
# D74 round 3: the new default ("auto": two loops under fast math and at d256, D70's one loop in d128's exact build)
# against D70's (d70) and the register program, with 32-bit loop counters (default_n), 11 rounds; fa90r3-conf: the
# catalog's attention cases on cuda:sm_90a on the general path and with the route "auto" (device mode)
step fa90r3-conf bash -c 'rc=0; timeout -k 5 110 python3 -m tilecore conformance run --target cuda:sm_90a -n 8 -k attention \
       --report /tmp/rep/cuda-d74-general --pass-config tilecore.cuda.register_programs=false || rc=$?;
     timeout -k 5 110 python3 -m tilecore conformance run --target cuda:sm_90a -n 8 -k attention \
       --report /tmp/rep/cuda-d74-auto --pass-config tilecore.cuda.register_programs=auto || rc=$?; exit $rc'
# fa90last-tests: D74's device tests (the two loops bit for bit D70's defaults on five forms, sequences 300 / 1000 /
# 1024, causal and not; fast math against float64) with D66's ("fit" among its options), ~3 min
step fa90last-tests timeout -k 5 230 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_fa_loops.py \
     tests/test_cuda_fa_parity.py -rs
# D80 (issue 17): the warp-specialized GEMM in block groups of two (thread-block clusters 2x1), B loaded half by each
# block and multicast to both (tilecore.group_multicast, general_gemm.py's ws-mc; the route's form
# tilecore.cuda.gemm_route_form="ws-mc"). gemmws: the burst (CUPTI, 30 launches after 1 s idle) in two processes,
# fp16 / bf16 at 4096^3 and 8192^3: cuBLAS, the default, D76's ws-us-doff and ws-mc at 128x256x64/3 panel 8 (~1.5 min).
# gemmws-256: the same once at cuBLAS's tile 256x128x64/3 (~1 min). gemmws-table: the table's rows (cuda_gemm.py,
# 128x256x64/3 p8, with Triton) with the defaults and with the route's form ws-mc (~2 min). gemmws-cold: the cold
# compile of the default and the route's forms ws / ws-mc (benchmarks/cold_compile.py, 3 fresh processes each).
# gemmws-prof: ncu (one launch, locked clock) of cuBLAS, the default, D76's ws3 and D80's wsmc at fp16 4096^3.
# gemmws-tests: the device tests (fp16 / bf16, six shapes, against float64 and bit for bit the kernel without groups)
step gemmws bash -c 'rc=0; for r in 1 2; do timeout -k 5 85 python3 benchmarks/gemm_burst.py --sizes 4096,8192 \
       --launches 30 --configs 128:256:64:256:3:8 --variants "${GEMMWS_VARIANTS:-ws-us-doff;ws-mc}" || rc=$?; done; exit $rc'
step gemmws-256 timeout -k 5 100 python3 benchmarks/gemm_burst.py --sizes 4096,8192 --launches 30 \
     --configs 256:128:64:256:3:8 --variants "ws-us-doff;ws-mc"
step gemmws-table bash -c 'rc=0; MC="{\"tilecore.cuda.gemm_route_form\": \"ws-mc\"}";
     for pc in "{}" "$MC"; do echo "== TILECORE_PASS_CONFIGS=$pc"; TILECORE_PASS_CONFIGS="$pc" timeout -k 5 80 \
       python3 benchmarks/cuda_gemm.py --rep 10 --sizes 4096,8192 --no-fp8 --triton --configs 128:256:64:256:3:8 || rc=$?; done;
     exit $rc'
step gemmws-cold timeout -k 5 120 python3 benchmarks/cold_compile.py --repeat 3 --variants default,route-ws,route-ws-mc \
     --kernel 4096,4096,4096,128,256,64,256,3,8
step gemmws-prof timeout -k 5 170 python3 scripts/gemm_profile.py --size 4096 --dtypes float16 \
     --variants cublas,t128x256,ws3,wsmc --timeout 40
step gemmws-tests timeout -k 5 170 python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_group_multicast.py -rs
# D80 round 3: the pair's blocks refill a stage only once both released it (round 2, ncu: wsmc's consumers wait for
# full stages 30% of the samples, ws3's 29% on wgmma): 4 stages (C stored in halves) for slack. gemmws-r3: the burst at
# 128x256x64/3 and /4 (default, ws-us-doff, ws-mc; ~1.5 min); gemmws-prof3: ncu of ws3, wsmc, wsmc4 (~1 min)
step gemmws-r3 timeout -k 5 150 python3 benchmarks/gemm_burst.py --sizes 4096,8192 --launches 30 \
     --configs 128:256:64:256:3:8,128:256:64:256:4:8 --variants "ws-us-doff;ws-mc"
# D80 round 4 (if there is one): round 3's ws-mc /4 reached 0.97x / 1.00x cuBLAS (4096^3 / 8192^3; ncu: the full-stage
# waits 30% -> 7%) but 4 stages store C in halves; 128x256x32 at 6 stages keeps the whole C tile beside 144 KiB of
# stages (213 KB): gemmws-r4, the burst at 128x256x32/6 and 128x256x64/3 (default, ws-us-doff, ws-mc; ~1.5 min)
step gemmws-r4 timeout -k 5 150 python3 benchmarks/gemm_burst.py --sizes 4096,8192 --launches 30 \
     --configs 128:256:32:256:6:8,128:256:64:256:3:8 --variants "ws-us-doff;ws-mc"
step gemmws-prof3 timeout -k 5 150 python3 scripts/gemm_profile.py --size 4096 --dtypes float16 \
     --variants ws3,wsmc,wsmc4 --timeout 40
# D77 (helper faauto, issues 11 + 17): FlashAttention's route on sm_90a, the general path by default ("auto" takes
# every form the WGMMA register program takes). faauto: benchmarks/fa_route.py, one process: d64 / d128 / GQA (8 KV
# heads) at 128x128, d128 at 128x176, d256 at 128x64, d128 at 64x64 (one consumer warpgroup), causal and not, the exact
# build and fast math; the general path (register_programs=False) and the WGMMA register program (True), compiled first
# (8 worker processes into the kernel cache), checked against SDPA cuDNN, then timed in turn with cuDNN 11 rounds (the
# order reversed every other round), medians; issue 17's bar and D77's route rule per row (~1.5-2.5 min)
step faauto timeout -k 5 230 python3 benchmarks/fa_route.py --rounds "${FAAUTO_ROUNDS:-11}" --inner-rep 10
# faauto-tests / faauto-tests2: the FlashAttention device tests on the new default (the general path): the general
# attention and Hopper files, then D66 / D70 / D74's (each < 3.5 min)
step faauto-tests timeout -k 5 230 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_general_attention.py tests/test_cuda_swizzle64.py \
     tests/test_cuda_hopper.py -rs
step faauto-tests2 timeout -k 5 230 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_fa_parity.py \
     tests/test_cuda_fa_unswitch.py tests/test_cuda_fa_loops.py -rs
# D81 (helper fa90d64, issues 11 + 17): d64 with two consumer warpgroups at 128x128 (D77: exact 0.925x, fast causal
# 0.94x the register program on the general path). fa90d64: benchmarks/fa_route.py on d64 only, causal and not, the
# exact build and fast math; the register program, the general path's default, descriptor offsets (desc: ping-pong's
# turn with the gemms back to back), desc + 32-bit loop counters (descn), desc + the masked iterations in a loop of
# their own (loops_desc); SDPA cuDNN in the same process, 15 interleaved rounds; then a second process with the order
# reversed (--reverse; the kernels from the cache), ~2.5 min. fa90d64-mix: D77's harness (d64 beside d128, GQA and d256
# in one process) with general / regprog / desc, ~2.5 min. fa90d64-ca: the same d64 kernels through
# benchmarks/cuda_attention.py --interleave (D66 / D74's harness, where d64's general kernel measured 1.04x), exact and
# fast math processes, ~2 min. fa90d64-prof: Nsight Compute (clocks locked) on d64 exact and fast causal, ~2 min
# D81 round 2 (round 1: the descriptor offsets measured slower at d64 and were reverted; the general path's exact d64
# kernel 1.04-1.07x the register program wherever it was not the first kernel after the cuDNN block; D77's 0.925 was
# that position). fa90d64-r2: the route as it is now (AUTO_GENERAL takes d64's exact build at 128x128: default = the
# general kernel there, the register program's under fast math), fa_route.py --shuffle (a fresh random order every
# round), two seeds, 15 rounds each, ~1.5 min. fa90d64-fast: d64 fast math causal (0.92-0.96x in every run) through
# cuda_attention.py: the register program, the default, ping-pong's turns off (nopp: the register program's fast-math
# schedule), D70's one unswitched loop (d70), 32-bit loop counters (default_n), D70's defaults off (before), 11 rounds,
# ~2 min. fa90d64-tests: the route's tests and the d64 device rows (test_cuda_general_attention's route / d64 tests,
# test_cuda_fa_parity / _loops / _unswitch d64 rows), then the catalog's attention cases on cuda:sm_90a, ~3 min
# fa90d64-bound: D81's fact of the masked loop's bound (tilecore.pipeline_masked_loop_bound, the default; nobound =
# D74's form) on every causal form with D74's two loops (fast math at d64 / d128 / GQA / d128 128x176, d256 in both
# builds), fa_route.py --shuffle, 11 rounds, the register program beside, ~2.5 min
step fa90d64-tests bash -c 'rc=0; timeout -k 5 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_general_attention.py \
       tests/test_cuda_fa_parity.py tests/test_cuda_fa_loops.py tests/test_cuda_fa_unswitch.py -k "d64 or auto" -rs || rc=$?;
     timeout -k 5 120 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_fa_d64.py -rs || rc=$?;
     timeout -k 5 60 python3 -m tilecore conformance run --target cuda:sm_90a -n 8 -k attention --report /tmp/rep/cuda-d81 || rc=$?;
     exit $rc'
# D81 round 3 (round 2: the masked loop's bound +5.6% on d64 fast causal, +12.6% on d128 fast causal, +1-2% on GQA /
# 128x176 / d256 fast causal; d64's fast causal row 0.975-0.993x with it): AUTO_GENERAL takes d64 at 128x128 in both
# builds. fa90d64-r3: fa_route d64, general / regprog / default (now the general kernel on all four rows), --shuffle,
# two seeds, 15 rounds, ~1 min. fa90d64-bound2: the bound again on the fast causal rows (d64, d128, GQA, d256,
# d128x176; general / nobound / regprog, another seed, 15 rounds), ~1.5 min. fa90d64-tests2: the two-loop device tests
# (test_cuda_fa_loops, test_cuda_fa_unswitch, test_cuda_fa_d64: bit for bit and float64 on every form the bound
# touches), ~3 min. fa90d64-tests3: the route's and D66's device tests (test_cuda_general_attention, test_cuda_fa_parity)
# and the catalog's attention cases on cuda:sm_90a on both routes, ~3 min
step fa90d64-tests2 timeout -k 5 220 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_fa_loops.py \
     tests/test_cuda_fa_unswitch.py tests/test_cuda_fa_d64.py -rs
step fa90d64-tests3 bash -c 'rc=0; timeout -k 5 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_general_attention.py \
       tests/test_cuda_fa_parity.py -rs || rc=$?;
     timeout -k 5 50 python3 -m tilecore conformance run --target cuda:sm_90a -n 8 -k attention --report /tmp/rep/cuda-d81b || rc=$?;
     timeout -k 5 50 python3 -m tilecore conformance run --target cuda:sm_90a -n 8 -k attention --report /tmp/rep/cuda-d81g \
       --pass-config tilecore.cuda.register_programs=false || rc=$?; exit $rc'
# fa90d256-more: the producer warpgroup on the other one-consumer forms the route already gives the general path
# (d128 and d64 at 64x64: general / ws, the register program for the ratio), 11 rounds (~1.5 min)
step fa90d256-sm80 bash -c 'rc=0; for x in "" --exact; do timeout -k 5 100 python3 benchmarks/mma_general.py --rep 10 --orders 2 \
       --fa 8,32,4096,256 --only fa64,fa64_causal --variants "${FA90D256_SM80:-regprog,attention-all,attention-all-fold}" $x || rc=$?;
     done; exit $rc'
# D82 round 2: fa90d256-r2: sm_90a d256 64x64, the register program, the new default route (default: the general path
# with a producer warpgroup and O by bulk stores, D82's AUTO_FORM_DEFAULTS), ws (round 1's producer warpgroup, direct
# stores), wsb (the default's kernel compiled as a variant: a noise estimate) and wsbr (+ the exit waiting only for the
# bulk stores' reads, tilecore.bulk_store_exit_wait="read"), cuDNN, 15 rounds (~1.5 min).
# fa90d256-r2-sm80: sm_80 64 rows d256 through the overlay: regprog and the new default route (default = round 1's
# attention-all-fold), fast math and exact, both orders (~1.5 min). fa90d256-tests: the FlashAttention device tests of
# the new routes (the d256 64x64 route against float64 and bit for bit the thread-0 form; sm_80's routed rows, 64 rows
# at d256 among them, against float64) (~3 min). fa90d256-conf: the catalog's attention cases on cuda:sm_90a and the
# sm_80 overlay's FlashAttention device tests of test_mma_general
step fa90d256-r2-sm80 bash -c 'rc=0; for x in "" --exact; do timeout -k 5 100 python3 benchmarks/mma_general.py --rep 10 --orders 2 \
       --fa 8,32,4096,256 --only fa64,fa64_causal --variants regprog,default $x || rc=$?; done; exit $rc'
step fa90d256-tests timeout -k 5 230 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_general_attention.py \
     tests/test_mma_route.py -rs -k "d82 or d61_staged or device_routed_default or the_routed"
step fa90d256-conf bash -c 'rc=0; timeout -k 5 110 python3 -m tilecore conformance run --target cuda:sm_90a -n 8 -k attention \
       --report /tmp/rep/cuda-d82-auto || rc=$?;
     timeout -k 5 110 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mma_general.py -rs -k device || rc=$?; exit $rc'
# D82 round 3: fa90d256-tests3: the d256 64x64 route's device test after round 2 (fast math's non-causal row differed in
# bits from the thread-0 form's: now against float64 there, bits in the exact build and for the exit's wait) (~40 s)
step fa90d256-tests3 timeout -k 5 120 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_general_attention.py -rs \
     -k "d82_d256"

# fa90x176-tests: D83's device tests (test_cuda_fa_loops.py: the offsets of P @ V and O over Q's tile bit for bit the
# defaults and against float64 on five forms, causal and not, three sequences; D74's with them), ~3 min
step fa90x176-tests timeout -k 5 220 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_fa_loops.py -rs
# D87 (exact causal): the candidates against the default and cuDNN, shuffled, both builds (~2.5 min); the causal rows
# with D54's order off / 16 heads a section and D74's two loops (~2 min); ncu of exact causal 128x128 (the default,
# the rescale in the turn with four chains, SDPA cuDNN) and fast causal (~2 min); the device tests (~1.5 min)
step exactcausal bash -c 'rc=0; timeout -k 5 200 python3 benchmarks/fa_route.py --forms d128,d128x176 \
       --variants "${EC_VARIANTS:-default,sit,ch4,sit_ch4,rsc,dsc,default2}" --shuffle 1 --rounds 11 --inner-rep 10 || rc=$?;
     timeout -k 5 150 python3 benchmarks/fa_route.py --forms d128,d128x176 --causal yes --builds exact \
       --variants default,hf_off,hf16,loops,sit_ch4,default2 --shuffle 2 --rounds 11 --inner-rep 10 || rc=$?; exit $rc'
step exactcausal-prof bash -c 'rc=0; timeout -k 5 130 python3 scripts/fa_profile.py --rows c128 --variants default,sit_ch4,dsc,cudnn \
       --batch 8 --tail --timeout 40 || rc=$?; timeout -k 5 60 python3 scripts/fa_profile.py --rows fc128 --variants default \
       --batch 8 --tail --timeout 40 || rc=$?; exit $rc'
step exactcausal-tests timeout -k 5 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_fa_scale_turn.py -rs
# the same benchmarks with the wheels of the tree before a change (.whl_before/, when carried): same machine, same run
if [ -d .whl_before ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_before \
      .whl_before/*.whl .whl/[!t]*.whl
  export PYTHONPATH=/tmp/site_before
  step before-host python3 benchmarks/host_costs.py
  step before-hostlaunch python3 benchmarks/host_costs.py --launch-only  # D57's rows with the tree before (main)
  step before-offpath python3 benchmarks/cuda_offpath.py --rep 20
  step before-gemm python3 benchmarks/cuda_gemm.py --rep 10 --sizes "${GEMM_SIZES:-4096,8192}" --no-fp8
  step before-attention python3 benchmarks/cuda_attention.py --rep 3
fi
(cd /tmp/rep && tar czf "$OUT/reports.tgz" .)
cat "$OUT/summary.txt"
# D86 (helper retire90, issue 11): the WGMMA register program retired; every sm_90a FlashAttention form on the general
# path. fa86: benchmarks/fa_route.py, the route's default and the general path (register_programs=False) against SDPA
# cuDNN in the same process, the forms of issue 17's table and the ones the program kept until D86 (d64 at 128x176,
# GQA at 128x64), causal and not, exact and fast, 11 shuffled rounds (~4 min); fa86-corpus: TileLang's GQA backward
# example's forward kernel (benchmarks/corpus_gqa_fwd.py: float64 check, cuDNN beside, ~1 min). fa86-tests: the
# FlashAttention device tests on the new route (~4 min)
step fa86 timeout -k 5 280 python3 benchmarks/fa_route.py --forms d64,d128,d128x176,gqa,d256,d256x64,d64x176,gqax64 \
     --variants default,general --shuffle 86 --rounds "${FA86_ROUNDS:-11}" --inner-rep 10 --workers 12
step fa86-corpus timeout -k 5 100 python3 benchmarks/corpus_gqa_fwd.py --rounds 15 --shuffle 86
step fa86-tests timeout -k 5 280 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_general_attention.py \
     tests/test_cuda_hopper.py tests/test_cuda_fa_parity.py tests/test_cuda_fa_unswitch.py tests/test_cuda_fa_loops.py \
     tests/test_mma_route.py -rs
