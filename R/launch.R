# The local launcher: thin wrapper over python/kerasdist/launch/.

# r-docs: python/kerasdist/launch/launcher.py:launch (make r-docs)
#' Run a command as a multi-worker cluster on this machine, restarting it on failure
#'
#' Each process gets `TF_CONFIG` (the shared cluster and its own task) and, for convenience,
#' `KERASDIST_TASK_TYPE`, `KERASDIST_TASK_INDEX` and `KERASDIST_RESTART` (0 on the first attempt, 1
#' after the first restart, ...). Its output lines are echoed to this process's stdout/stderr
#' prefixed with its role and index: `[worker 0] Epoch 1/3`.
#'
#' A process fails when it exits with a non-zero status (status 75, `kerasdist.PREEMPTED_EXIT_CODE`,
#' "preempted, checkpoint saved", and 77, `kerasdist.HUNG_EXIT_CODE`, "no training step for
#' hang_timeout", included) or is killed by a signal. The launcher then stops every process of the
#' group (SIGTERM to its process group, SIGKILL after `grace_period` seconds; after a status 75 or a
#' hang it first gives the others `grace_period` seconds to finish on their own, as multi-worker
#' kerasdist runs stop together on preemption, and their step watchdogs fire together on a hang)
#' and, while restarts remain, starts the whole group again on fresh ports, so that training resumes
#' from the latest checkpoint. With `min_workers` below `num_workers`, a group that still fails once
#' its restarts are used up goes on with one worker fewer (TF_CONFIG then names the workers left;
#' kerasdist resumes the newest checkpoint with the same global batch, more samples per worker),
#' with `max_restarts` restarts again, down to `min_workers`. A group start whose server reports its
#' port already taken (the ports are found free, then released, so another program may grab one
#' first) is retried up to 3 times without using a restart.
#'
#' The run succeeds when every worker has exited with status 0 or, with parameter servers, when the
#' chief (the coordinator) has. Tasks still running then (parameter servers and parameter-server
#' workers, which serve until stopped) are stopped.
#'
#' Security: TensorFlow's gRPC runtime has no authentication. TF_CONFIG names `host` (127.0.0.1 by
#' default), but TensorFlow's servers bind `0.0.0.0:PORT` whatever it says: never expose those ports
#' to an untrusted network (firewall them, or use a container or network namespace without outside
#' access).
#'
#' From R: on Linux a launcher killed outright (SIGKILL) leaves nothing running: each task gets
#' SIGTERM when the launcher dies. Bad input is refused before anything starts, with an error of
#' class `kerasdist_ValueError` naming the argument.
#'
#' @param command Character vector: the program and its arguments. A first element ending in `.R`
#'   runs with `Rscript`, one ending in `.py` with kerasdist's Python; anything else must be an
#'   executable file or on the `PATH`.
#' @param num_workers Number of "worker" tasks, at least 1.
#' @param num_ps Number of "ps" (parameter server) tasks. With 1 or more, a "chief" task (the
#'   coordinator) is added to the cluster, so `num_workers + num_ps + 1` processes run.
#' @param max_restarts How many times the whole group may be restarted after a failure (at each
#'   size, with `min_workers`).
#' @param host The local address the ports are picked on and TF_CONFIG names (the address the
#'   processes connect to each other on).
#' @param timeout Wall-clock limit in seconds for the whole run, restarts included; `NULL` for none.
#'   When reached, the group is stopped and `exit_code` is 124.
#' @param grace_period Seconds between SIGTERM and SIGKILL when a group is stopped (time for
#'   checkpoints to save on SIGTERM); 0 or more (0 sends SIGKILL at once).
#' @param env A named list or character vector of extra environment variables for every process.
#' @param cwd Working directory of the processes (and of a relative script path); `NULL`: the
#'   current one.
#' @param startup_timeout Seconds within which every worker and ps task must come up (its TensorFlow
#'   server accepting connections on its port); a task that does not is named ("worker 1 did not
#'   come up within 60 s ...") and counts as a failure (exit code 124 when it ends the run). `NULL`
#'   (the default) waits as long as TensorFlow does, which is forever.
#' @param min_workers The fewest workers to go on with when failures outlast `max_restarts`; `NULL`
#'   (the default) is `num_workers`: never fewer. Not with parameter servers.
#' @param warm_start Fork each Python task (a `.py` command) from a process that has already
#'   imported TensorFlow and Keras (`kerasdist.launch.warm_start`), so that starts and restarts skip
#'   that import (about 6 s of CPU each). `TRUE` starts such a server for the run (or uses the one
#'   `KERASDIST_WARM_START` names); `NULL` (the default) uses `KERASDIST_WARM_START`'s if set;
#'   `FALSE` never. A task whose environment differs from the server's in what the import reads
#'   (TF_*, KERAS_*, PYTHON*, ...) starts cold, as without it.
#' @returns A list of class `kerasdist_launch_result`, invisibly: `exit_code` (0 on success; the
#'   failing process's status, 128 + N if signal N killed it, 124 on timeout or when a task did not
#'   come up within `startup_timeout`), `ok`, `restarts`, `failed` (e.g.
#'   `"worker 1 was killed by SIGKILL"`, or `NULL`), `failures` (every failure that stopped a group,
#'   oldest first), `timed_out`, `message`, `cluster`, `port_retries` and `exit_codes` (per attempt,
#'   every task's exit status once the group stopped, -N if signal N ended it, e.g.
#'   `c("worker 0" = 75L, "worker 1" = 75L)` for a multi-worker run preempted by SIGTERM) and
#'   `num_workers` (the workers of the last attempt: fewer than asked after going on without one).
#' @family launch
#' @seealso Python: `kerasdist.launch()`; command line:
#'   `kerasdist launch -n N -- COMMAND ...`.
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
