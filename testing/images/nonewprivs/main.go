// Command nonewprivs stands for nnp, the program of Kubernetes' e2e image
// nonewprivs (critest's NoNewPrivs specs): installed setuid root, it prints
// the effective user it runs as. A container whose no_new_privs bit is set
// keeps its own user across the exec; without the bit it runs as root.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Printf("Effective uid: %d\n", os.Geteuid())
}
