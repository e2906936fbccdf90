"""Writes topk_marked.cu: crates/cuda/src/kernels/topk.cu with a clock64() read by thread 0 at
the end of each phase (load, each histogram pass and its bin choice, the gathering walk, the
emitting walk) into tk_diag[block][phase], for phases.cu. Fails if the kernel's text moved."""
import os

here = os.path.dirname(os.path.abspath(__file__))
s = open(os.path.join(here, "../../crates/cuda/src/kernels/topk.cu")).read()
s = ("__device__ long long tk_diag[256 * 16];\n"
     "#define TKM(i) do { if (threadIdx.x == 0) tk_diag[blockIdx.x * 16 + (i)] = clock64(); } while (0)\n"
     + s)
def rep(a,b,cnt=1):
    global s
    assert s.count(a)==cnt,(a,s.count(a))
    s=s.replace(a,b)
rep('''                atomicAdd(&s.hist[b], 1u);
            }
        }
        __syncthreads();''','''                atomicAdd(&s.hist[b], 1u);
            }
        }
        __syncthreads();
        TKM(2 + 2 * pass);''')
rep('''            hi = last < (unsigned long long)hi ? (unsigned int)last : hi;
        }
        __syncthreads();
    }''','''            hi = last < (unsigned long long)hi ? (unsigned int)last : hi;
        }
        __syncthreads();
        TKM(3 + 2 * pass);
    }
    TKM(10);''')
rep('''        m_before += (int)s.hist[w];
    }
    __syncthreads();''','''        m_before += (int)s.hist[w];
    }
    __syncthreads();
    TKM(11);''')
rep('''        r += __popc(mb);
    }
}''','''        r += __popc(mb);
    }
    __syncthreads();
    TKM(12);
}''')
rep('''    const float* row = scores + (size_t)blockIdx.x * n;
''','''    TKM(0);
    const float* row = scores + (size_t)blockIdx.x * n;
''')
rep('''    tk_span(s, l, h);
    unsigned int* dst''','''    tk_span(s, l, h);
    TKM(1);
    unsigned int* dst''')
open(os.path.join(here, "topk_marked.cu"), "w").write(s)
