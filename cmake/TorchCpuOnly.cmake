# libtorch's CPU half, for targets that never touch a GPU: the pip wheel's `torch` target links libtorch_cuda and,
# through it, the CUDA libraries (cuBLAS, cuDNN, NCCL...), which every process then loads at start: 0.5 s and
# 350 MiB more per process on the CI machine (bench/RESULTS.md, "Process start"), and each test is its own process.
# The target gets every definition and include directory of libtorch's targets (USE_DISTRIBUTED, the CUDA include
# directory...), so its objects are compiled from the same command lines as a build that links the whole library,
# and links only libtorch_cpu (kept even where no symbol is used: its static initializers register the operators)
# and libc10.
function(slm_torch_cpu_only target)
  find_library(SLM_TORCH_CPU torch_cpu PATHS ${TORCH_INSTALL_PREFIX}/lib REQUIRED NO_DEFAULT_PATH)
  find_library(SLM_C10 c10 PATHS ${TORCH_INSTALL_PREFIX}/lib REQUIRED NO_DEFAULT_PATH)
  add_library(${target} INTERFACE)
  foreach(t torch torch_cpu torch_cuda torch_library)
    if(TARGET ${t})
      target_compile_definitions(${target} INTERFACE $<TARGET_PROPERTY:${t},INTERFACE_COMPILE_DEFINITIONS>)
      target_include_directories(${target} SYSTEM INTERFACE $<TARGET_PROPERTY:${t},INTERFACE_INCLUDE_DIRECTORIES>)
      target_compile_options(${target} INTERFACE $<TARGET_PROPERTY:${t},INTERFACE_COMPILE_OPTIONS>)
    endif()
  endforeach()
  target_link_libraries(${target} INTERFACE "-Wl,--no-as-needed,${SLM_TORCH_CPU}" "-Wl,--as-needed" ${SLM_C10})
  target_link_options(${target} INTERFACE -Wl,-rpath,${TORCH_INSTALL_PREFIX}/lib)
endfunction()
