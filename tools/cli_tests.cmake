# ctest cases of the flashattn command-line tool (label `cli`). Include from tests/CMakeLists.txt:
#   if(TARGET flashattn_cli)
#     include(${PROJECT_SOURCE_DIR}/tools/cli_tests.cmake)
#   endif()
# Small sizes, CPU backend: `run --check` must pass for each feature and a few combinations;
# bad command lines must give one "flashattn: error: ..." line.

set(_fa "$<TARGET_FILE:flashattn_cli>")
set(_run ${_fa} run --device cpu --check --repeat 1 --threads 2)

function(flashattn_cli_test name)
  add_test(NAME cli.${name} COMMAND ${ARGN})
  set_tests_properties(cli.${name} PROPERTIES LABELS cli)
endfunction()

# A bad command line: the test passes when the output matches `regex` (one error line).
function(flashattn_cli_error_test name regex)
  flashattn_cli_test(${name} ${ARGN})
  set_tests_properties(cli.${name} PROPERTIES PASS_REGULAR_EXPRESSION "${regex}")
endfunction()

# ---- run --check: must pass -------------------------------------------------------------------
flashattn_cli_test(run.dense_gqa_causal ${_run} --batch 2 --seqlen-q 113 --seqlen-k 77 --heads 4 --kv-heads 2 --head-dim 64 --causal)
flashattn_cli_test(run.dense_fp16 ${_run} --dtype fp16 --batch 1 --seqlen-q 33 --heads 3 --kv-heads 1 --head-dim 40)
flashattn_cli_test(run.varlen_window_alibi_softcap ${_run} --varlen --window 16,0 --alibi --softcap 30 --batch 3 --seqlen-q 65 --heads 4 --head-dim 32)
flashattn_cli_test(run.varlen_paged ${_run} --varlen --paged --page-size 16 --batch 3 --seqlen-q 50 --seqlen-k 80 --heads 4 --kv-heads 2 --head-dim 64 --causal)
flashattn_cli_test(run.kvcache_paged_append_rotary ${_run} --kvcache --paged --page-size 16 --splits 3 --batch 2 --seqlen-q 5 --seqlen-k 200 --heads 8 --kv-heads 2 --head-dim 64 --causal --append 5 --rotary neox)
flashattn_cli_test(run.kvcache_splits_interleaved ${_run} --kvcache --splits 4 --batch 3 --seqlen-q 1 --seqlen-k 300 --heads 4 --kv-heads 4 --head-dim 128 --append 1 --rotary interleaved --window 100,-1)
# FP8 (e4m3): prefill with q, k, v e4m3 (out bf16), and an e4m3 KV cache under a bf16 / e4m3 q,
# with append (quantized into the cache) and rotary; --check holds them to the FP8 bound.
flashattn_cli_test(run.fp8_dense_gqa_causal ${_run} --dtype e4m3 --batch 2 --seqlen-q 77 --seqlen-k 101 --heads 4 --kv-heads 2 --head-dim 64 --causal)
flashattn_cli_test(run.fp8_varlen_paged ${_run} --dtype e4m3 --varlen --paged --page-size 16 --batch 3 --seqlen-q 40 --seqlen-k 70 --heads 4 --kv-heads 2 --head-dim 64 --causal)
flashattn_cli_test(run.fp8_kvcache_paged_append_rotary ${_run} --kvcache --kv-dtype e4m3 --paged --page-size 16 --splits 3 --batch 2 --seqlen-q 3 --seqlen-k 150 --heads 8 --kv-heads 2 --head-dim 64 --causal --append 3 --rotary neox)
flashattn_cli_test(run.fp8_kvcache_fp16_q ${_run} --kvcache --dtype fp16 --kv-dtype e4m3 --batch 3 --seqlen-q 1 --seqlen-k 200 --heads 4 --kv-heads 4 --head-dim 128 --append 1)
flashattn_cli_test(run.fp8_kvcache_e4m3_q ${_run} --kvcache --dtype e4m3 --batch 2 --seqlen-q 2 --seqlen-k 120 --heads 4 --kv-heads 2 --head-dim 64 --append 2 --causal)
add_test(NAME cli.run.json COMMAND ${_run} --json --batch 1 --seqlen-q 17 --heads 2 --head-dim 32 --alibi)
set_tests_properties(cli.run.json PROPERTIES LABELS cli PASS_REGULAR_EXPRESSION "\"pass\": true")
flashattn_cli_test(bench.quick ${_fa} bench --device cpu --quick --causal on --head-dims 32 --seqlens 64 --threads 2)
flashattn_cli_test(bench.quick_fp16 ${_fa} bench --device cpu --quick --dtype fp16 --causal on --head-dims 32 --seqlens 64 --threads 2)
flashattn_cli_test(bench.decode_quick ${_fa} bench --device cpu --decode --batches 2 --seqlens 256 --page-size 16 --threads 2)

# ---- bad command lines ----------------------------------------------------------------------
flashattn_cli_error_test(bad.unknown_flag "flashattn: error: unknown option '--bogus'" ${_fa} run --bogus)
flashattn_cli_error_test(bad.missing_value "flashattn: error: --batch needs a value" ${_fa} run --batch)
flashattn_cli_error_test(bad.window "flashattn: error: --window: expected" ${_fa} run --window 3)
flashattn_cli_error_test(bad.paged_dense "flashattn: error: --paged needs --kvcache or --varlen" ${_fa} run --paged)
flashattn_cli_error_test(bad.append_too_long "flashattn: error: --append 10 does not fit" ${_fa} run --kvcache --append 10 --seqlen-k 5)
flashattn_cli_error_test(bad.gqa_shape "flashattn: error: " ${_fa} run --device cpu --heads 6 --kv-heads 4 --seqlen-q 8)
flashattn_cli_error_test(bad.command "flashattn: error: unknown command" ${_fa} frobnicate)
flashattn_cli_error_test(bad.dtype "flashattn: error: --dtype: expected bf16, fp16 or e4m3" ${_fa} run --dtype fp32)
flashattn_cli_error_test(bad.kv_dtype_prefill "flashattn: error: --kv-dtype needs --kvcache" ${_fa} run --kv-dtype e4m3)
flashattn_cli_error_test(bad.bench_fp8 "flashattn: error: --dtype e4m3: FP8 is measured with 'flashattn run'" ${_fa} bench --dtype e4m3)
# sizes whose products overflow, or pass what the library indexes with int32 (issue 31)
flashattn_cli_error_test(bad.size_overflow "flashattn: error: the problem is too large: q would take" ${_fa} run --device cpu --batch 2147483647 --seqlen-q 2147483647 --heads 8)
flashattn_cli_error_test(bad.varlen_rows "flashattn: error: --varlen: --batch x --seqlen-q" ${_fa} run --device cpu --varlen --batch 65536 --seqlen-q 65536 --head-dim 8)
flashattn_cli_error_test(bad.paged_pages "flashattn: error: --paged: --batch x pages per sequence" ${_fa} run --device cpu --kvcache --paged --page-size 1 --batch 65536 --seqlen-q 1 --seqlen-k 65536)
flashattn_cli_error_test(bad.kvcache_positions "flashattn: error: --kvcache: the cache capacity" ${_fa} run --device cpu --kvcache --seqlen-q 1 --seqlen-k 2147483647)
add_test(NAME cli.bad.exit_status COMMAND ${_fa} run --bogus)
set_tests_properties(cli.bad.exit_status PROPERTIES LABELS cli WILL_FAIL TRUE)
