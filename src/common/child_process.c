/* Children that do not outlive the process that started them: see internal.h. */
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "internal.h"

bool fp4d_child_dies_with_parent(pid_t parent)
{
    /* Linux: SIGKILL when the parent goes, kept across execve. A parent that died before the
     * call is seen as a different parent pid (the child was re-parented). */
    return prctl(PR_SET_PDEATHSIG, SIGKILL) == 0 && getppid() == parent;
}
