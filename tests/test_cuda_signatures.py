"""cuda_signatures: the __global__ kernels of a CUDA source and their parameters' launch codes, read from text."""
import pytest

from minitensor.kernels import cuda_signatures as cs
from minitensor.kernels.cuda_signatures import Param

SOURCE = r'''
#include <stdint.h>
#define KERNEL __global__ void from_macro(int n)
// __global__ void in_line_comment(int n) {}
/* __global__ void in_block_comment(int n) {} */
const char *text = "__global__ void in_string(int n) { }";
const char *raw = R"x(__global__ void in_raw_string(int n) { })x";
char brace = '{'; int big = 1'000'000;

extern "C" __global__ void __launch_bounds__(256, 2)
scalars(int a, signed b, int32_t c, unsigned d, unsigned int e, uint32_t f, long long g, int64_t h, long i,
        ptrdiff_t j, unsigned long long k, uint64_t l, size_t m, unsigned long n, float o, double p,
        const int q, long unsigned int r, std::size_t s)
{
}

extern "C" __global__ void pointers(const float* __restrict__ a, float *b, float * c, float*d, void *e,
                                    struct Pair *f, Pair* const g, const double *__restrict__ const h, int **i,
                                    float j[], unsigned long long *k) {}

extern "C" {
__global__ void in_block(int n) { if (n) { } }
__device__ float helper(float x) { return x; }
}

namespace ops { namespace inner {
__global__ void cpp_kernel(char a, short b, bool c, __half d, const float &e, Pair f, unsigned char g) {}
template <typename T, int N> __global__ void templated(T *x, T value, int n) {}
__device__ int counter;
}}

__global__ void overloaded(int a) {}
__global__ void overloaded(float a) {}
__global__ void declared_only(int a);
__global__ void no_params(void) {}
static __global__ void unnamed(float *, int, const size_t) {}
'''


@pytest.fixture(scope="module")
def kernels():
    return cs.parse(SOURCE)


def test_finds_definitions_only(kernels):
    assert sorted(kernels) == ["in_block", "no_params", "ops::inner::cpp_kernel", "ops::inner::templated",
                               "overloaded", "pointers", "scalars", "unnamed"]


def test_scalar_kinds(kernels):
    signature = kernels["scalars"]
    assert signature.extern_c and not signature.template and signature.line == 10
    assert signature.kinds == "iiiuuullllqqqqfdiqq"
    assert [p.name for p in signature.params][:3] == ["a", "b", "c"]
    assert signature.params[16] == Param("q", "const int", "i")
    assert signature.params[18] == Param("s", "std::size_t", "q")


def test_pointer_kinds_and_spelling(kernels):
    params = kernels["pointers"].params
    assert all(p.kind == "p" for p in params)
    assert [p.name for p in params] == list("abcdefghijk")
    assert [p.ctype for p in params] == ["const float *", "float *", "float *", "float *", "void *",
                                         "struct Pair *", "Pair * const", "const double * const", "int **",
                                         "float *", "unsigned long long *"]


def test_unsupported_types_have_no_kind(kernels):
    signature = kernels["ops::inner::cpp_kernel"]
    assert not signature.extern_c and signature.scope == "ops::inner" and signature.name == "cpp_kernel"
    assert [p.kind for p in signature.params] == [None] * 7
    assert [p.ctype for p in signature.params] == ["char", "short", "bool", "__half", "const float &", "Pair",
                                                   "unsigned char"]
    assert signature.kinds is None


def test_templates_are_marked(kernels):
    signature = kernels["ops::inner::templated"]
    assert signature.template and signature.kinds is None
    assert [p.kind for p in signature.params] == ["p", None, "i"]


def test_overloads_are_marked_ambiguous(kernels):
    signature = kernels["overloaded"]
    assert signature.overloaded and signature.kinds is None
    assert signature.params == (Param("a", "int", "i"),)  # the first definition's


def test_extern_c_block_no_params_and_unnamed(kernels):
    assert kernels["in_block"].extern_c and kernels["in_block"].kinds == "i"
    assert kernels["no_params"].params == () and kernels["no_params"].kinds == ""
    assert not kernels["no_params"].extern_c
    assert kernels["unnamed"].params == (Param("", "float *", "p"), Param("", "int", "i"),
                                         Param("", "const size_t", "q"))


def test_clean_keeps_offsets_and_lines():
    text = cs.clean(SOURCE)
    assert len(text) == len(SOURCE) and text.count("\n") == SOURCE.count("\n")
    for gone in ("in_line_comment", "in_block_comment", "in_string", "in_raw_string"):
        assert gone not in text
    assert "'{'" not in text and "1'000'000" in text and 'extern "C"' in text


def test_definitions_include_device_functions():
    found = [(d.qualifier, d.name, d.scope, d.extern_c) for d in cs.definitions(cs.clean(SOURCE))]
    assert ("__device__", "helper", "", True) in found
    assert not any(name == "counter" for _, name, _, _ in found)  # a __device__ variable
    helper = next(d for d in cs.definitions(cs.clean(SOURCE)) if d.name == "helper")
    assert SOURCE[helper.body[0]] == "{" and SOURCE[helper.body[1]] == "}"


def test_host_and_device_orderings():
    source = "__host__ __device__ inline int f(int x) { return x; }\n" \
             "__device__ __host__ int g(int x) { return x; }\n" \
             "template <class T>\n__global__ void __launch_bounds__(128) k(T *p, const T *__restrict__ q) {}\n"
    assert [d.name for d in cs.definitions(cs.clean(source))] == ["f", "g", "k"]
    k = cs.parse(source)["k"]
    assert k.template and k.line == 4 and [p.ctype for p in k.params] == ["T *", "const T *"]
