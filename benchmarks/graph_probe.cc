// Shows what XLA puts into its CUDA graphs: loaded into a process (ctypes) and
// started with graph_probe_start(path), it subscribes to CUDA driver calls
// through CUPTI and, whenever the process instantiates a CUDA graph, writes the
// graph's nodes (type; kernel name and grid for kernel nodes; child graphs
// walked in turn) and its edges with their types (default, programmatic,
// launch completion) to `path`. benchmarks/xla_graph.py drives it.
//
//   nvcc -shared -Xcompiler -fPIC -o graph_probe.so graph_probe.cc -lcupti -lcuda
#include <cuda.h>
#include <cupti.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

FILE* g_out = nullptr;
std::mutex g_mu;
CUpti_SubscriberHandle g_subscriber;
int g_graphs = 0;

const char* node_type(CUgraphNodeType t) {
  switch (t) {
    case CU_GRAPH_NODE_TYPE_KERNEL: return "KERNEL";
    case CU_GRAPH_NODE_TYPE_MEMCPY: return "MEMCPY";
    case CU_GRAPH_NODE_TYPE_MEMSET: return "MEMSET";
    case CU_GRAPH_NODE_TYPE_HOST: return "HOST";
    case CU_GRAPH_NODE_TYPE_GRAPH: return "GRAPH";
    case CU_GRAPH_NODE_TYPE_EMPTY: return "EMPTY";
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: return "WAIT_EVENT";
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD: return "EVENT_RECORD";
    case CU_GRAPH_NODE_TYPE_CONDITIONAL: return "CONDITIONAL";
    default: return "OTHER";
  }
}

const char* edge_type(const CUgraphEdgeData& d) {
  switch (d.type) {
    case CU_GRAPH_DEPENDENCY_TYPE_DEFAULT: return "default";
    case CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC: return "programmatic";
    default: return "other";
  }
}

// A node's label: its type, and for a kernel node the kernel's name (cut to 40
// characters) and grid.
std::string label(CUgraphNode node) {
  CUgraphNodeType t;
  if (cuGraphNodeGetType(node, &t) != CUDA_SUCCESS) return "?";
  std::string s = node_type(t);
  if (t == CU_GRAPH_NODE_TYPE_KERNEL) {
    CUDA_KERNEL_NODE_PARAMS p;
    std::memset(&p, 0, sizeof(p));
    if (cuGraphKernelNodeGetParams(node, &p) == CUDA_SUCCESS) {
      const char* name = nullptr;
      if (p.func != nullptr) cuFuncGetName(&name, p.func);
      if (name == nullptr && p.kern != nullptr) cuKernelGetName(&name, p.kern);
      std::string n = name ? name : "?";
      if (n.size() > 40) n = n.substr(0, 40);
      char grid[64];
      std::snprintf(grid, sizeof(grid), " grid %ux%u block %u", p.gridDimX, p.gridDimY,
                    p.blockDimX);
      s += " " + n + grid;
    }
  }
  return s;
}

// Writes graph `g` (nested `depth` deep): node and edge counts by type, the
// first nodes in full, and every distinct (from, to, edge type) with its count.
void walk(CUgraph g, int depth) {
  const std::string pad(2 * depth, ' ');
  size_t n = 0;
  cuGraphGetNodes(g, nullptr, &n);
  std::vector<CUgraphNode> nodes(n);
  if (n) cuGraphGetNodes(g, nodes.data(), &n);
  std::map<CUgraphNode, size_t> index;
  std::map<std::string, int> kinds;
  for (size_t i = 0; i < n; ++i) {
    index[nodes[i]] = i;
    kinds[label(nodes[i])]++;
  }
  size_t e = 0;
  cuGraphGetEdges(g, nullptr, nullptr, nullptr, &e);
  std::vector<CUgraphNode> from(e), to(e);
  std::vector<CUgraphEdgeData> data(e);
  if (e) cuGraphGetEdges(g, from.data(), to.data(), data.data(), &e);
  std::fprintf(g_out, "%sgraph: %zu nodes, %zu edges\n", pad.c_str(), n, e);
  for (const auto& [k, count] : kinds) {
    std::fprintf(g_out, "%s  node x%d: %s\n", pad.c_str(), count, k.c_str());
  }
  std::map<std::string, int> edges;
  for (size_t i = 0; i < e; ++i) {
    edges[label(from[i]) + "  ->  " + label(to[i]) + "  [" + edge_type(data[i]) +
          (data[i].from_port ? ", from_port " + std::to_string(data[i].from_port) : "") + "]"]++;
  }
  for (const auto& [k, count] : edges) {
    std::fprintf(g_out, "%s  edge x%d: %s\n", pad.c_str(), count, k.c_str());
  }
  int shown = 0;
  for (size_t i = 0; i < n; ++i) {
    CUgraphNodeType t;
    if (cuGraphNodeGetType(nodes[i], &t) == CUDA_SUCCESS && t == CU_GRAPH_NODE_TYPE_GRAPH &&
        shown < 2) {
      CUgraph child;
      if (cuGraphChildGraphNodeGetGraph(nodes[i], &child) == CUDA_SUCCESS) {
        std::fprintf(g_out, "%s  child graph of node %zu:\n", pad.c_str(), i);
        walk(child, depth + 2);
        ++shown;
      }
    }
  }
}

void CUPTIAPI on_driver_call(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                             const void* data) {
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (info->callbackSite != CUPTI_API_ENTER || info->functionName == nullptr ||
      std::strncmp(info->functionName, "cuGraphInstantiate", 18) != 0) {
    return;
  }
  // Every cuGraphInstantiate* takes (CUgraphExec* out, CUgraph graph, ...).
  struct Params {
    CUgraphExec* exec;
    CUgraph graph;
  };
  const CUgraph g = static_cast<const Params*>(info->functionParams)->graph;
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(g_out, "== %s #%d\n", info->functionName, ++g_graphs);
  walk(g, 0);
  std::fflush(g_out);
}

}  // namespace

extern "C" {

// Starts writing every instantiated graph to `path`; 0 on success.
int graph_probe_start(const char* path) {
  g_out = std::fopen(path, "w");
  if (g_out == nullptr) return -1;
  if (cuptiSubscribe(&g_subscriber, on_driver_call, nullptr) != CUPTI_SUCCESS) return -2;
  if (cuptiEnableDomain(1, g_subscriber, CUPTI_CB_DOMAIN_DRIVER_API) != CUPTI_SUCCESS) return -3;
  return 0;
}

// Writes a line of the caller's into the file (which chain runs next).
void graph_probe_note(const char* text) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_out) std::fprintf(g_out, "# %s\n", text);
}

// Stops and closes the file; returns how many graphs were written.
int graph_probe_stop() {
  cuptiUnsubscribe(g_subscriber);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_out) std::fclose(g_out);
  g_out = nullptr;
  return g_graphs;
}

}  // extern "C"
