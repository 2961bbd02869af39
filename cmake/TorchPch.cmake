# Precompiled <torch/torch.h> only where a source needs libtorch.
#
# The precompiled header is ~730 MB: loading it costs a translation unit 10-15 s of CPU before its first line, while
# a source that never includes libtorch compiles in 2-3 s without it (bench/RESULTS.md, "Build time"). Half of the
# library and a third of the tests include no libtorch header at all, so they are compiled without the PCH.
#
# A source needs libtorch when its include closure within the project (quoted includes, resolved against the
# including file's directory, src/ and tests/) reaches a <torch/...> or <ATen/...> header. The scan runs at configure
# time; a source that gains a libtorch include later still compiles (it includes the header itself), only without
# the PCH until the next configure.

function(_slm_reaches_torch file out)
  get_property(known GLOBAL PROPERTY "SLM_TORCH_${file}" SET)
  if(known)
    get_property(v GLOBAL PROPERTY "SLM_TORCH_${file}")
    set(${out} ${v} PARENT_SCOPE)
    return()
  endif()
  set_property(GLOBAL PROPERTY "SLM_TORCH_${file}" FALSE)  # a cycle counts as "no" until proven otherwise
  file(STRINGS "${file}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  get_filename_component(dir "${file}" DIRECTORY)
  set(result FALSE)
  foreach(line IN LISTS includes)
    if(line MATCHES "#[ \t]*include[ \t]*<(torch|ATen)/")
      set(result TRUE)
      break()
    endif()
    if(NOT line MATCHES "#[ \t]*include[ \t]*\"([^\"]+)\"")
      continue()
    endif()
    set(name "${CMAKE_MATCH_1}")
    foreach(base IN ITEMS "${dir}" "${PROJECT_SOURCE_DIR}/src" "${PROJECT_SOURCE_DIR}/tests")
      if(EXISTS "${base}/${name}")
        get_filename_component(header "${base}/${name}" ABSOLUTE)
        _slm_reaches_torch("${header}" sub)
        if(sub)
          set(result TRUE)
        endif()
        break()
      endif()
    endforeach()
    if(result)
      break()
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY "SLM_TORCH_${file}" ${result})
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# Marks the C++ sources of `target` that do not reach libtorch with SKIP_PRECOMPILE_HEADERS.
function(slm_pch_only_for_torch_sources target)
  get_target_property(sources ${target} SOURCES)
  get_target_property(source_dir ${target} SOURCE_DIR)
  foreach(src IN LISTS sources)
    if(NOT src MATCHES "\\.cpp$")
      continue()
    endif()
    get_filename_component(path "${src}" ABSOLUTE BASE_DIR "${source_dir}")
    _slm_reaches_torch("${path}" needs)
    if(NOT needs)
      set_source_files_properties("${src}" TARGET_DIRECTORY ${target} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
    endif()
  endforeach()
endfunction()
