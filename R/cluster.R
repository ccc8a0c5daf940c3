# Cluster signals: thin wrappers over python/kerasdist/cluster.py.

# r-docs: python/kerasdist/cluster.py:parse_tf_config (make r-docs)
#' Validate a TF_CONFIG and describe its cluster
#'
#' @param tf_config JSON text or a nested list such as
#'   `list(cluster = list(worker = c("host1:2222", "host2:2222")), task = list(type = "worker", index = 0))`.
#' @returns A list: `source`, `cluster`, `task_type`, `task_index`, `num_workers`, `num_ps`,
#'   `is_chief`. A `kerasdist_ValueError` condition naming what is wrong otherwise.
#' @family strategy
#' @seealso Python: `kerasdist.parse_tf_config()`.
#' @examplesIf !is.null(kerasdist_python())
#' parse_tf_config('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}')
#' @export
parse_tf_config <- function(tf_config) {
  py_record_to_r(call_python(kerasdist_module()$parse_tf_config, tf_config = tf_config), "is_chief")
}
