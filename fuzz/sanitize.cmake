# slm_asan_tests: the AddressSanitizer + UndefinedBehaviorSanitizer test subset (scripts/sanitize.sh, build-asan).
#
# What is instrumented: the sources the subset tests exercise — the parsers (slm_parsers, the fuzz targets' objects)
# and the server, the engines, the text room, the router and the data loader (slm_san_core) — and the subset's test
# files. The rest of the library (the model, its ops, training: ~90 files of libtorch code, 30+ minutes to compile)
# comes from the main build's libslm_core.a: the linker takes an archive member only for symbols the instrumented
# objects do not define, so every instrumented file replaces its uninstrumented copy. Mixing is what ASan expects
# (libtorch itself is not instrumented either): heap errors are caught in instrumented code whoever allocated the
# memory, and the allocator and the leak checker cover the whole process. Both builds must come from the same sources.
if(NOT SLM_MAIN_BUILD OR NOT EXISTS ${SLM_MAIN_BUILD}/src/libslm_core.a)
  message(FATAL_ERROR "SLM_SANITIZE_TESTS needs SLM_MAIN_BUILD, a built main build directory (${SLM_MAIN_BUILD}/src/"
                      "libslm_core.a is missing: run scripts/setup.sh)")
endif()

find_package(GTest REQUIRED)
find_path(SENTENCEPIECE_INCLUDE_DIR sentencepiece_processor.h REQUIRED)
find_library(SENTENCEPIECE_LIBRARY sentencepiece REQUIRED)
find_library(SENTENCEPIECE_TRAIN_LIBRARY sentencepiece_train REQUIRED)
find_library(TREE_SITTER_LIBRARY tree-sitter REQUIRED)
find_library(HTTPLIB_LIBRARY cpp-httplib REQUIRED)
# As src/CMakeLists.txt: code including httplib.h must define the macros Debian's library was built with.
set(SLM_HTTPLIB_DEFINITIONS CPPHTTPLIB_OPENSSL_SUPPORT CPPHTTPLIB_ZLIB_SUPPORT CPPHTTPLIB_BROTLI_SUPPORT)

file(GLOB SLM_SAN_CORE_SOURCES CONFIGURE_DEPENDS ${SLM_SRC}/server/*.cpp ${SLM_SRC}/engine/*.cpp ${SLM_SRC}/text/*.cpp)
list(APPEND SLM_SAN_CORE_SOURCES ${SLM_SRC}/router/route.cpp ${SLM_SRC}/router/train.cpp ${SLM_SRC}/data/loader.cpp)
list(REMOVE_ITEM SLM_SAN_CORE_SOURCES ${SLM_PARSER_SOURCES})
add_library(slm_san_core STATIC ${SLM_SAN_CORE_SOURCES})
target_include_directories(slm_san_core PUBLIC ${SLM_ROOT}/src PRIVATE ${SENTENCEPIECE_INCLUDE_DIR})
# slm_torch_cpu has the main build's definitions of libtorch (USE_DISTRIBUTED...): both copies see the same headers.
target_link_libraries(slm_san_core PUBLIC slm_torch_cpu nlohmann_json::nlohmann_json)
target_precompile_headers(slm_san_core PRIVATE <torch/torch.h>)
set_source_files_properties(${SLM_SRC}/server/http_server.cpp ${SLM_SRC}/server/chat_client.cpp PROPERTIES
  COMPILE_DEFINITIONS "${SLM_HTTPLIB_DEFINITIONS}")

# The subset: the server's, the engines' and the text room's tests, the data parsers', safetensors, the router and
# the recipes.
# Left out: the files whose tests drive build/slm as a process (test_cli, test_default_ensemble_cli,
# test_openai_client, test_ollama_client, test_chat_url, test_chat_page: they exercise the uninstrumented program,
# through Python clients and a browser) and the rest of the suite (the model, ops and training, not instrumented here).
file(GLOB SLM_ASAN_TEST_SOURCES CONFIGURE_DEPENDS
  ${SLM_ROOT}/tests/server/*.cpp ${SLM_ROOT}/tests/engine/*.cpp ${SLM_ROOT}/tests/text/*.cpp
  ${SLM_ROOT}/tests/recipe/*.cpp)
list(APPEND SLM_ASAN_TEST_SOURCES
  ${SLM_ROOT}/tests/data/test_shards.cpp ${SLM_ROOT}/tests/data/test_pack.cpp ${SLM_ROOT}/tests/data/test_loader.cpp
  ${SLM_ROOT}/tests/io/test_safetensors.cpp ${SLM_ROOT}/tests/router/test_router.cpp)
list(FILTER SLM_ASAN_TEST_SOURCES EXCLUDE REGEX "/(test_cli|test_default_ensemble_cli|test_openai_client|test_ollama_client|test_chat_url|test_chat_page)\\.cpp$")
add_executable(slm_asan_tests ${SLM_ASAN_TEST_SOURCES})
target_include_directories(slm_asan_tests PRIVATE ${SLM_ROOT}/tests)
target_compile_definitions(slm_asan_tests PRIVATE SLM_SOURCE_DIR="${SLM_ROOT}" SLM_BINARY="${SLM_MAIN_BUILD}/slm")
target_precompile_headers(slm_asan_tests PRIVATE <torch/torch.h> <gtest/gtest.h>)
file(GLOB SLM_ASAN_HTTP_TEST_SOURCES CONFIGURE_DEPENDS ${SLM_ROOT}/tests/server/*.cpp)
set_source_files_properties(${SLM_ASAN_HTTP_TEST_SOURCES} PROPERTIES COMPILE_DEFINITIONS "${SLM_HTTPLIB_DEFINITIONS}")
# Instrumented objects first; then the main library for the rest, and what it links (src/CMakeLists.txt, in its
# order: sentencepiece before libtorch, see there). The archive is wrapped in --start-group so that its members may
# need each other in any order.
target_link_libraries(slm_asan_tests PRIVATE
  slm_san_core slm_parsers
  -Wl,--start-group ${SLM_MAIN_BUILD}/src/libslm_core.a ${SLM_MAIN_BUILD}/src/libslm_tree_sitter_cpp.a -Wl,--end-group
  ${SENTENCEPIECE_TRAIN_LIBRARY} ${SENTENCEPIECE_LIBRARY} ${TORCH_LIBRARIES} nlohmann_json::nlohmann_json
  ${TREE_SITTER_LIBRARY} ${LZMA_LIBRARY} ${HTTPLIB_LIBRARY} GTest::gtest GTest::gtest_main)

enable_testing()
include(GoogleTest)
gtest_discover_tests(slm_asan_tests DISCOVERY_TIMEOUT 120 PROPERTIES TIMEOUT 900)
