# The local launcher: thin wrapper over python/kerasdist/launch/.

#' Run a command as a multi-worker cluster on this machine, restarting it on failure
#'
#' Starts one process per task of a local cluster, each with its own
#' `TF_CONFIG` (plus `KERASDIST_TASK_TYPE`, `KERASDIST_TASK_INDEX` and
#' `KERASDIST_RESTART`, 0 on the first attempt), on free ports of `host`. Each
#' line the processes print is echoed prefixed with the task, e.g.
#' `[worker 1] Epoch 2/5`.
#'
#' When a process fails (a non-zero exit status, status 75 "preempted,
#' checkpoint saved" included, or killed by a signal), the whole group is
#' stopped (SIGTERM, then SIGKILL after `grace_period` seconds) and started
#' again on fresh ports, up to `max_restarts` times (0 by default: without
#' `max_restarts` a failure ends the run), so that training resumes
#' from its latest checkpoint. The run succeeds when every worker exits with
#' status 0; with parameter servers (`num_ps > 0`) the cluster also has a
#' `"chief"` task, ParameterServerStrategy's coordinator, and the run succeeds
#' when the chief exits with status 0 (the servers, which never exit on their
#' own, are then stopped). On Linux a launcher killed outright (SIGKILL)
#' leaves nothing running: each task gets SIGTERM when the launcher dies.
#'
#' TensorFlow's gRPC runtime has no authentication: anyone who can reach the
#' ports can run code in the training processes. `TF_CONFIG` names `host`
#' (127.0.0.1 by default), so the processes talk over loopback, but
#' TensorFlow's servers listen on their ports on every interface (they bind
#' `0.0.0.0:PORT` whatever `TF_CONFIG` says): never run this where an untrusted
#' network can reach the ports; firewall them, or use a container or network
#' namespace without outside access.
#'
#' Bad input is refused before anything starts, with an error of class
#' `kerasdist_ValueError` naming the argument.
#'
#' @param command Character vector: the program and its arguments. A first
#'   element ending in `.R` runs with `Rscript`, one ending in `.py` with
#'   kerasdist's Python; anything else must be an executable file or on the
#'   `PATH`.
#' @param num_workers Number of `"worker"` tasks, at least 1.
#' @param num_ps Number of `"ps"` (parameter server) tasks; with 1 or more, a
#'   `"chief"` task (the coordinator) is added.
#' @param max_restarts How many times the whole group may be restarted after
#'   a failure (at each size, with `min_workers`).
#' @param host The local address the ports are picked on and `TF_CONFIG`
#'   names (where the processes connect to each other).
#' @param timeout Wall-clock limit in seconds for the whole run, restarts
#'   included, or `NULL` for none; when reached the group is stopped and
#'   `exit_code` is 124.
#' @param grace_period Seconds between SIGTERM and SIGKILL when a group is
#'   stopped (time for checkpoints to save on SIGTERM); 0 or more (0 sends
#'   SIGKILL at once).
#' @param env Named list or character vector of extra environment variables
#'   for every process.
#' @param cwd Working directory of the processes, or `NULL` for the current
#'   one.
#' @returns A list of class `kerasdist_launch_result`, invisibly:
#'   `exit_code` (0 on success; the failing process's status, 128 + N if
#'   signal N killed it, 124 on timeout or when a task did not come up within
#'   `startup_timeout`), `ok`, `restarts`, `failed` (e.g.
#'   `"worker 1 was killed by SIGKILL"`, or `NULL`), `failures` (every failure
#'   that stopped a group, oldest first), `timed_out`, `message`, `cluster`,
#'   `port_retries` and `exit_codes` (per attempt, every task's exit status
#'   once the group stopped, -N if signal N ended it, e.g. `c("worker 0" = 75L, "worker 1" = 75L)`
#'   for a multi-worker run preempted by SIGTERM) and `num_workers` (the
#'   workers of the last attempt: fewer than asked after going on without
#'   one).
#' @family launch
#' @seealso Python: `kerasdist.launch()`; command line:
#'   `python -m kerasdist launch -n N -- COMMAND ...`.
#' @param startup_timeout Seconds within which every worker and ps task must
#'   come up (its TensorFlow server accepting connections); a task that does
#'   not is named and counts as a failure. `NULL` waits as long as TensorFlow.
#' @param min_workers The fewest workers to go on with: a group that still
#'   fails once its restarts are used up goes on with one worker fewer (with
#'   `max_restarts` restarts again), down to `min_workers`; training resumes
#'   from the newest checkpoint with the same global batch. `NULL` (the
#'   default) is `num_workers`: never fewer. Not with parameter servers.
#' @param warm_start `TRUE` forks each Python task (a `.py` command) from a
#'   process that has already imported TensorFlow and Keras, so
#'   that starts and restarts skip that import (about 6 s of CPU each);
#'   `NULL` (the default) does so only when the environment variable
#'   `KERASDIST_WARM_START` names a running server; `FALSE` never. A task
#'   whose environment differs from the server's in what the import reads
#'   (`TF_*`, `KERAS_*`, `PYTHON*`, ...) starts cold, as without it.
#' @examples
#' \dontrun{
#' # train.R reads TF_CONFIG through select_strategy() and resumes from its checkpoints
#' result <- launch(c("train.R", "--epochs", "5"), num_workers = 2, max_restarts = 3)
#' if (!result$ok) stop(result$message)
#' }
#' @export
launch <- function(command, num_workers, num_ps = 0L, max_restarts = 0L,
                   host = "127.0.0.1", timeout = NULL, grace_period = 10,
                   env = NULL, cwd = NULL, startup_timeout = NULL, min_workers = NULL,
                   warm_start = NULL) {
  if (!is.character(command)) {
    kerasdist_abort("command must be a character vector: the program and its arguments.", call = sys.call())
  }
  result <- call_python(
    kerasdist_module()$launch, as.list(command),
    num_workers = num_workers, num_ps = num_ps,
    max_restarts = max_restarts, host = host, timeout = timeout,
    grace_period = grace_period, env = as.list(env),
    cwd = if (is.null(cwd)) NULL else path.expand(cwd), startup_timeout = startup_timeout,
    min_workers = min_workers, warm_start = warm_start
  )
  invisible(launch_result_to_r(result))
}

launch_result_to_r <- function(result) {
  record <- py_record_to_r(result, "ok")
  record$cluster <- lapply(record$cluster, as.character)
  record$failures <- vapply(result$failures, function(f) f$description, character(1))
  record["failed"] <- list(if (is.null(result$failed)) NULL else result$failed$description)
  record$exit_codes <- lapply(record$exit_codes, unlist)
  structure(record, class = "kerasdist_launch_result")
}

#' @export
print.kerasdist_launch_result <- function(x, ...) {
  cat(sprintf("launch: %s\nexit code: %d, restarts: %d\n", x$message, x$exit_code, x$restarts))
  invisible(x)
}
